//! Routing a body through a director the way the ext_proc adapter does, for tests and benches
//! that drive a [`Director`] without a stream.

use epp::director::{Body, Director, DirectorError, Incoming, Routed};

/// Parses `body` once as `path`'s API, as the ext_proc adapter does, and routes it.
pub fn route(
    d: &Director,
    path: &str,
    body: &[u8],
    rng: &mut impl rand::Rng,
) -> Result<Routed, DirectorError> {
    let api = epp::request::ApiKind::from_path(path);
    let request = epp::request::parse(api, body, d.prompt_cap())?;
    let inc = Incoming {
        body: Body::Parsed {
            request: &request,
            bytes: body,
        },
        ..Default::default()
    };
    d.route(&inc, rng)
}
