//! The parameters of the disaggregating profile handlers, as upstream reads them.
//!
//! `disagg-profile-handler` takes the nested form (`stageOrder`, `profiles.{decode,prefill,
//! encode}`, `deciders.{prefill,encode}`) or, deprecated, the flat one (`decodeProfile`,
//! `prefillProfile`, `encodeProfile`, `prefillDeciderPluginName`, `encodeDeciderPluginName`,
//! `deciderPluginName`); each is decoded strictly, and a document that is neither is an error
//! naming both attempts. `pd-profile-handler` (deprecated since llm-d v0.7) takes its own flat
//! form and defaults its decider to the plugin named `prefix-based-pd-decider`.

use super::StageOrder;
use crate::plugin::{Invalid, PluginKind};
use serde::Deserialize;

/// The handler configuration both handler types reduce to.
#[derive(Clone, Debug, PartialEq)]
pub struct HandlerParams {
    pub(crate) order: StageOrder,
    pub(crate) decode: String,
    pub(crate) prefill: String,
    pub(crate) encode: String,
    pub(crate) prefill_decider: Option<String>,
    pub(crate) encode_decider: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct Nested {
    stage_order: Option<String>,
    profiles: Profiles,
    deciders: Deciders,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Profiles {
    decode: Option<String>,
    prefill: Option<String>,
    encode: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Deciders {
    prefill: Option<String>,
    encode: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct Flat {
    stage_order: Option<String>,
    decode_profile: Option<String>,
    prefill_profile: Option<String>,
    encode_profile: Option<String>,
    prefill_decider_plugin_name: Option<String>,
    encode_decider_plugin_name: Option<String>,
    decider_plugin_name: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
struct Pd {
    decode_profile: Option<String>,
    prefill_profile: Option<String>,
    prefix_plugin_type: Option<String>,
    prefix_plugin_name: Option<String>,
    primary_port: i64,
    decider_plugin_name: Option<String>,
    prefix_match_info_producer_name: Option<String>,
}

fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Upstream's `ParseStageOrder`: case, `-` and `_` do not matter; empty is decode-first.
pub(crate) fn parse_stage_order(s: &str) -> Result<StageOrder, Invalid> {
    let norm: String = s
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    match norm.as_str() {
        "" | "decodefirst" | "decode" => Ok(StageOrder::DecodeFirst),
        "prefillfirst" | "prefill" => Ok(StageOrder::PrefillFirst),
        _ => Err(Invalid::new(
            "stageOrder",
            format!("invalid stage order {s:?}, must be \"decode-first\" or \"prefill-first\""),
        )),
    }
}

impl HandlerParams {
    /// `disagg-profile-handler`'s parameters.
    pub(crate) fn disagg(v: &serde_norway::Value) -> Result<Self, Invalid> {
        let (order, profiles, deciders) = if v.is_null() {
            (None, Profiles::default(), Deciders::default())
        } else {
            match serde_norway::from_value::<Nested>(v.clone()) {
                Ok(n) => (n.stage_order, n.profiles, n.deciders),
                Err(nested) => match serde_norway::from_value::<Flat>(v.clone()) {
                    Ok(f) => {
                        tracing::info!("Deprecated: using flat parameter format, migrate to nested profiles/deciders format");
                        let prefill = nonempty(f.prefill_decider_plugin_name)
                            .or(nonempty(f.decider_plugin_name));
                        let profiles = Profiles {
                            decode: f.decode_profile,
                            prefill: f.prefill_profile,
                            encode: f.encode_profile,
                        };
                        let deciders = Deciders {
                            prefill,
                            encode: f.encode_decider_plugin_name,
                        };
                        (f.stage_order, profiles, deciders)
                    }
                    Err(flat) => {
                        return Err(Invalid::new("parameters", format!("failed to parse parameters of the disagg-profile-handler: nested schema error: {nested}; legacy schema error: {flat} (use one format exclusively: either nested profiles/deciders or the deprecated flat fields)")));
                    }
                },
            }
        };
        let order = parse_stage_order(order.as_deref().unwrap_or(""))?;
        let prefill_decider = nonempty(deciders.prefill);
        if order == StageOrder::PrefillFirst && prefill_decider.is_some() {
            return Err(Invalid::new(
                "deciders.prefill",
                "prefill decider is not supported in prefill-first stage order",
            ));
        }
        Ok(Self {
            order,
            decode: nonempty(profiles.decode).unwrap_or_else(|| "decode".into()),
            prefill: nonempty(profiles.prefill).unwrap_or_else(|| "prefill".into()),
            encode: nonempty(profiles.encode).unwrap_or_else(|| "encode".into()),
            prefill_decider,
            encode_decider: nonempty(deciders.encode),
        })
    }

    /// `pd-profile-handler`'s parameters (deprecated upstream, accepted as upstream does).
    pub(crate) fn pd(v: &serde_norway::Value) -> Result<Self, Invalid> {
        tracing::info!(
            "Deprecated: pd-profile-handler is deprecated, use disagg-profile-handler instead"
        );
        let p: Pd = if v.is_null() {
            Pd::default()
        } else {
            serde_norway::from_value(v.clone()).map_err(|e| {
                Invalid::new("parameters", format!("failed to parse the parameters of the 'pd-profile-handler' profile handler - {e}"))
            })?
        };
        let _unused = (
            p.prefix_plugin_type,
            p.prefix_plugin_name,
            p.prefix_match_info_producer_name,
        );
        if p.primary_port != 0 {
            if !(1..=65535).contains(&p.primary_port) {
                return Err(Invalid::new(
                    "primaryPort",
                    format!(
                        "invalid primaryPort: must be between 1 and 65535, got {}",
                        p.primary_port
                    ),
                ));
            }
            return Err(Invalid::new("primaryPort", "primaryPort (upstream's deprecated data-parallel path, x-data-parallel-host-port) is not supported by epp: list one InferencePool targetPort per rank instead"));
        }
        let decider = p
            .decider_plugin_name
            .unwrap_or_else(|| PluginKind::PrefixBasedPdDecider.name().into());
        if decider.is_empty() {
            return Err(Invalid::new(
                "deciderPluginName",
                "decider plugin name is not defined",
            ));
        }
        Ok(Self {
            order: StageOrder::DecodeFirst,
            decode: p.decode_profile.unwrap_or_else(|| "decode".into()),
            prefill: p.prefill_profile.unwrap_or_else(|| "prefill".into()),
            encode: String::new(),
            prefill_decider: Some(decider),
            encode_decider: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> serde_norway::Value {
        serde_norway::from_str(s).unwrap()
    }

    #[test]
    fn nested_flat_and_empty_parameters_reduce_to_the_same_shape() {
        let empty = HandlerParams::disagg(&serde_norway::Value::Null).unwrap();
        assert_eq!(
            (
                empty.decode.as_str(),
                empty.prefill.as_str(),
                empty.encode.as_str()
            ),
            ("decode", "prefill", "encode")
        );
        assert_eq!(empty.prefill_decider, None);
        let nested = HandlerParams::disagg(&yaml(
            "{profiles: {decode: d, prefill: p}, deciders: {prefill: x, encode: y}}",
        ))
        .unwrap();
        let flat = HandlerParams::disagg(&yaml(
            "{decodeProfile: d, prefillProfile: p, prefillDeciderPluginName: x, encodeDeciderPluginName: y}",
        ))
        .unwrap();
        assert_eq!(nested, flat);
        assert_eq!(nested.prefill_decider.as_deref(), Some("x"));
        let alias = HandlerParams::disagg(&yaml("{deciderPluginName: z}")).unwrap();
        assert_eq!(alias.prefill_decider.as_deref(), Some("z"));
    }

    #[test]
    fn stage_order_is_parsed_loosely_and_checked() {
        for (s, want) in [
            ("decode-first", StageOrder::DecodeFirst),
            ("Prefill_First", StageOrder::PrefillFirst),
            ("prefill", StageOrder::PrefillFirst),
            ("", StageOrder::DecodeFirst),
        ] {
            assert_eq!(parse_stage_order(s), Ok(want), "{s}");
        }
        let err = HandlerParams::disagg(&yaml("{stageOrder: sideways}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid stage order \"sideways\""), "{err}");
        let err = HandlerParams::disagg(&yaml(
            "{stageOrder: prefill-first, deciders: {prefill: prefix-based-pd-decider}}",
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("not supported in prefill-first"), "{err}");
    }

    #[test]
    fn mixed_or_unknown_fields_name_both_schemas() {
        let err = HandlerParams::disagg(&yaml("{profiles: {decode: d}, decodeProfile: d}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nested schema error") && err.contains("legacy schema error"),
            "{err}"
        );
        let err = HandlerParams::disagg(&yaml("{deciders: {prefil: x}}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("prefil"), "{err}");
    }

    #[test]
    fn pd_profile_handler_defaults_its_decider_and_refuses_primary_port() {
        let p = HandlerParams::pd(&serde_norway::Value::Null).unwrap();
        assert_eq!(
            p.prefill_decider.as_deref(),
            Some("prefix-based-pd-decider")
        );
        let p = HandlerParams::pd(&yaml(
            "{decodeProfile: dd, prefillProfile: pp, deciderPluginName: mine, prefixPluginType: prefix-cache-scorer}",
        ))
        .unwrap();
        assert_eq!((p.decode.as_str(), p.prefill.as_str()), ("dd", "pp"));
        assert_eq!(p.prefill_decider.as_deref(), Some("mine"));
        let err = HandlerParams::pd(&yaml("{primaryPort: 70000}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("between 1 and 65535"), "{err}");
        let err = HandlerParams::pd(&yaml("{primaryPort: 8000}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not supported by epp"), "{err}");
        let err = HandlerParams::pd(&yaml("{deciderPluginName: ''}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("decider plugin name is not defined"), "{err}");
        assert!(
            HandlerParams::pd(&yaml("{stageOrder: x}")).is_err(),
            "strict"
        );
    }
}
