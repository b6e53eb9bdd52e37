//! Where the model's `tokenizer.json` is: llm-d's local tokenizer configuration.
//!
//! llm-d's precise scorer reads `indexerConfig.tokenizersPoolConfig`: `modelName`, and under
//! `local` a `modelTokenizerMap` (model → path of its tokenizer.json) and/or an
//! `autoDiscoveryDir` searched for `autoDiscoveryTokenizerFileName` (default `tokenizer.json`),
//! each file named by its directory relative to the search root, or by the model of a
//! Hugging Face cache directory (`models--Qwen--Qwen3-0.6B/…` → `Qwen/Qwen3-0.6B`). The same
//! keys mean the same here, so llm-d configurations carry over. epp holds one tokenizer per
//! pool: `modelName` picks it, and may be left out when exactly one file is known. The `hf`
//! (download) and `uds` (sidecar) sources are not supported: epp does not fetch at run time.

use super::HfError;
use serde_norway::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// llm-d's default search root (model volumes are mounted there).
const DEFAULT_DIR: &str = "/mnt/models";
const DEFAULT_FILE: &str = "tokenizer.json";
/// Bounds on the auto-discovery walk, so a misconfigured root cannot stall start-up.
const MAX_DEPTH: usize = 8;
const MAX_ENTRIES: usize = 100_000;

/// A `tokenizersPoolConfig.local` block with the pool's `modelName`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LocalTokenizer {
    pub(crate) model_name: Option<String>,
    pub(crate) auto_discovery_dir: Option<PathBuf>,
    pub(crate) file_name: String,
    pub(crate) model_tokenizer_map: BTreeMap<String, PathBuf>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LocalBlock {
    auto_discovery_dir: Option<PathBuf>,
    auto_discovery_tokenizer_file_name: Option<String>,
    #[serde(default)]
    model_tokenizer_map: BTreeMap<String, PathBuf>,
}

impl LocalTokenizer {
    /// Reads `tokenizersPoolConfig` from a precise scorer's `indexerConfig`; `None` when it has
    /// no (non-null) `local` block.
    pub(crate) fn from_indexer_config(indexer: &Value) -> Result<Option<Self>, HfError> {
        let Some(pool) = indexer.get("tokenizersPoolConfig") else {
            return Ok(None);
        };
        let Some(local) = pool.get("local").filter(|l| !l.is_null()) else {
            return Ok(None);
        };
        let block: LocalBlock = serde_norway::from_value(local.clone())
            .map_err(|e| HfError::Local(format!("tokenizersPoolConfig.local: {e}")))?;
        let model_name = pool
            .get("modelName")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_owned);
        let auto_discovery_dir = match (
            block.auto_discovery_dir,
            block.model_tokenizer_map.is_empty(),
        ) {
            (Some(d), _) => Some(d),
            (None, true) => Some(PathBuf::from(DEFAULT_DIR)),
            (None, false) => None,
        };
        let file_name = block
            .auto_discovery_tokenizer_file_name
            .unwrap_or_else(|| DEFAULT_FILE.to_owned());
        Ok(Some(Self {
            model_name,
            auto_discovery_dir,
            file_name,
            model_tokenizer_map: block.model_tokenizer_map,
        }))
    }

    /// The tokenizer file to load: the explicit map first, then auto-discovery.
    pub(crate) fn resolve(&self) -> Result<PathBuf, HfError> {
        let mut known = self.model_tokenizer_map.clone();
        if let Some(dir) = &self.auto_discovery_dir {
            for (model, path) in discover(dir, &self.file_name) {
                known.entry(model).or_insert(path);
            }
        }
        let names = || known.keys().cloned().collect::<Vec<_>>().join(", ");
        match &self.model_name {
            Some(m) => known.get(m).cloned().ok_or_else(|| {
                HfError::Local(format!(
                    "no tokenizer for modelName {m:?} (known: [{}])",
                    names()
                ))
            }),
            None if known.len() == 1 => Ok(known.into_values().next().unwrap_or_default()),
            None if known.is_empty() => Err(HfError::Local(format!(
                "no {} found (modelTokenizerMap empty, searched {:?})",
                self.file_name, self.auto_discovery_dir
            ))),
            None => Err(HfError::Local(format!(
                "several tokenizers ([{}]): set tokenizersPoolConfig.modelName",
                names()
            ))),
        }
    }
}

/// Model name → path of every `file_name` under `root` (missing or unreadable dirs: none).
fn discover(root: &Path, file_name: &str) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    let mut seen = 0;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                return found;
            }
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < MAX_DEPTH {
                stack.push((path, depth + 1));
            } else if !kind.is_dir() && entry.file_name() == file_name {
                if let Some(model) = model_name(root, &path) {
                    found.entry(model).or_insert(path);
                }
            }
        }
    }
    found
}

/// llm-d's naming: a `models--org--name` component gives `org/name`; otherwise the directory
/// holding the file, relative to the root (`.` when it is the root itself).
fn model_name(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).ok()?;
    let hf = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find_map(|c| c.strip_prefix("models--"));
    if let Some(name) = hf {
        return Some(name.replace("--", "/"));
    }
    let dir = rel.parent()?.to_str()?;
    Some(if dir.is_empty() {
        ".".to_owned()
    } else {
        dir.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(yaml: &str) -> Option<LocalTokenizer> {
        LocalTokenizer::from_indexer_config(&serde_norway::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn reads_llm_d_keys_and_resolves_by_model_name() {
        let root = std::env::temp_dir().join(format!("epp-hf-local-{}", std::process::id()));
        for dir in ["llama-7b", "hub/models--Qwen--Qwen3-0.6B/snapshots/abc"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
            std::fs::write(root.join(dir).join("tokenizer.json"), "{}").unwrap();
        }
        let yaml = format!("{{tokenizersPoolConfig: {{modelName: Qwen/Qwen3-0.6B, local: {{autoDiscoveryDir: {}}}}}}}", root.display());
        let l = local(&yaml).unwrap();
        assert_eq!(
            l.resolve().unwrap(),
            root.join("hub/models--Qwen--Qwen3-0.6B/snapshots/abc/tokenizer.json")
        );
        let unnamed = LocalTokenizer {
            model_name: None,
            ..l.clone()
        };
        assert!(unnamed
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("set tokenizersPoolConfig.modelName"));
        let other = LocalTokenizer {
            model_name: Some("nope".into()),
            ..l
        };
        assert!(
            other
                .resolve()
                .unwrap_err()
                .to_string()
                .contains("llama-7b"),
            "the error lists the known models"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_explicit_map_needs_no_search_and_absent_blocks_mean_tiktoken() {
        let l =
            local("{tokenizersPoolConfig: {local: {modelTokenizerMap: {m: /x/tokenizer.json}}}}")
                .unwrap();
        assert_eq!(
            (l.auto_discovery_dir.as_ref(), l.resolve().unwrap()),
            (None, PathBuf::from("/x/tokenizer.json"))
        );
        assert_eq!(
            local("{tokenizersPoolConfig: {local: null, hf: {tokenizersCacheDir: /tmp}}}"),
            None
        );
        assert_eq!(local("{prefixStoreConfig: {}}"), None);
        assert_eq!(
            local("{tokenizersPoolConfig: {local: {}}}")
                .unwrap()
                .auto_discovery_dir,
            Some(PathBuf::from(DEFAULT_DIR))
        );
        let bad = serde_norway::from_str("{tokenizersPoolConfig: {local: {mapping: {}}}}").unwrap();
        assert!(LocalTokenizer::from_indexer_config(&bad).is_err());
    }
}
