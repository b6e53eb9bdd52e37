//! The one place where errors become wire answers: HTTP status, body text, `details` for
//! Envoy's access log, and the `error_code` metric label.
//!
//! Bodies are OpenAI-shaped JSON whose message is upstream's text, so both OpenAI clients and
//! tools matching upstream's `inference error: <Code> - <message>` understand them:
//! `{"error":{"message":"inference error: BadRequest - ...","type":"BadRequest","code":400}}`.
//!
//! Backpressure clients can act on (upstream issue #1082: a 429 or 503 did not say why): every
//! 429 and 503 carries a `Retry-After` header (seconds) and two more fields in `error`,
//! `reason` (`pool_saturated`, `no_ready_endpoints`, `shed_by_priority`) and
//! `retry_after_seconds`. The message text is unchanged, so matching on it keeps working.
//!
//! llm-d-router v0.10's drop reasons: every 429 and 503 also carries
//! `x-llm-d-request-dropped-reason` with upstream's value (`pkg/common/error/error.go`):
//! `rejected-saturated` (every candidate filtered out, a full flow-control queue, a shed
//! sheddable request — upstream's legacy shed omits the header, epp sets it as its flow-control
//! path does), `rejected-no-endpoints` (no candidate), `rejected-ttl-expired` (waited out its
//! queue TTL: 429 while the pool has endpoints, as upstream) and `rejected-shutting-down`.
//! `Prefer: if-available` with nothing cached answers 412 `PreconditionFailed`, no drop reason.

use crate::director::DirectorError;
use crate::metrics::ErrorCode;
use crate::request::RequestError;
use crate::scheduling::ScheduleError;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HeaderMutation, ImmediateResponse, ProcessingResponse,
};

/// Upstream's error codes (`pkg/common/error/error.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    BadRequest,
    PreconditionFailed,
    ResourceExhausted,
    ServiceUnavailable,
    Internal,
    RequestTimeout,
    PayloadTooLarge,
    HeadersTooLarge,
}

impl Code {
    pub(crate) fn http_status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::PreconditionFailed => 412,
            Self::RequestTimeout => 408,
            Self::PayloadTooLarge => 413,
            Self::HeadersTooLarge => 431,
            Self::ResourceExhausted => 429,
            Self::Internal => 500,
            Self::ServiceUnavailable => 503,
        }
    }

    /// The `error_code` metric label.
    pub(crate) fn label(self) -> ErrorCode {
        match self {
            Self::BadRequest => ErrorCode::BadRequest,
            Self::PreconditionFailed => ErrorCode::PreconditionFailed,
            Self::RequestTimeout => ErrorCode::RequestTimeout,
            Self::PayloadTooLarge => ErrorCode::PayloadTooLarge,
            Self::HeadersTooLarge => ErrorCode::RequestHeaderFieldsTooLarge,
            Self::ResourceExhausted => ErrorCode::ResourceExhausted,
            Self::Internal => ErrorCode::Internal,
            Self::ServiceUnavailable => ErrorCode::ServiceUnavailable,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequest",
            Self::PreconditionFailed => "PreconditionFailed",
            Self::RequestTimeout => "RequestTimeout",
            Self::PayloadTooLarge => "PayloadTooLarge",
            Self::HeadersTooLarge => "RequestHeaderFieldsTooLarge",
            Self::ResourceExhausted => "ResourceExhausted",
            Self::Internal => "Internal",
            Self::ServiceUnavailable => "ServiceUnavailable",
        }
    }
}

/// Why a request was turned away for lack of capacity: what a client should do differs (retry
/// soon, retry later, lower its priority or back off harder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backpressure {
    /// Every candidate was filtered out as busy (or otherwise unsuitable): retry shortly.
    PoolSaturated,
    /// The pool has no endpoint to route to (none discovered, none in the subset): pods take
    /// seconds to come up, so retry later.
    NoReadyEndpoints,
    /// A sheddable request (priority < 0) met a saturated pool.
    ShedByPriority,
}

impl Backpressure {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::PoolSaturated => "pool_saturated",
            Self::NoReadyEndpoints => "no_ready_endpoints",
            Self::ShedByPriority => "shed_by_priority",
        }
    }

    /// The `Retry-After` value, in seconds.
    pub(crate) fn retry_after_secs(self) -> u32 {
        match self {
            Self::PoolSaturated => 1,
            Self::NoReadyEndpoints => 5,
            Self::ShedByPriority => 2,
        }
    }
}

/// The `x-llm-d-request-dropped-reason` response header.
pub(crate) const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

/// Why a request never reached a model server, by upstream's `RequestDroppedReason` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DroppedReason {
    Saturated,
    NoEndpoints,
    TtlExpired,
    ShuttingDown,
}

impl DroppedReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Saturated => "rejected-saturated",
            Self::NoEndpoints => "rejected-no-endpoints",
            Self::TtlExpired => "rejected-ttl-expired",
            Self::ShuttingDown => "rejected-shutting-down",
        }
    }
}

/// Errors that end a stream before routing, besides the director's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    #[error(transparent)]
    Director(#[from] DirectorError),
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("request body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("request exceeds {limit} ext_proc messages")]
    TooManyMessages { limit: usize },
    #[error("request headers exceed {limit} bytes")]
    HeadersTooLarge { limit: usize },
    #[error(transparent)]
    Flow(#[from] crate::director::flowcontrol::FlowError),
}

impl StreamError {
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::Director(DirectorError::BadRequest(_)) => Code::BadRequest,
            Self::Director(DirectorError::NoCandidates(_) | DirectorError::Screened) => {
                Code::ServiceUnavailable
            }
            Self::Director(DirectorError::Schedule(_)) => Code::ResourceExhausted,
            Self::Director(DirectorError::Shed(_)) => Code::ResourceExhausted,
            Self::Director(DirectorError::UnknownEndpoint(_)) => Code::Internal,
            Self::Director(DirectorError::NotCached) => Code::PreconditionFailed,
            // As llm-d-router v0.10 answers an admission plugin's refusal.
            Self::Director(DirectorError::NotAdmitted(_)) => Code::Internal,
            Self::BodyTooLarge { .. } => Code::PayloadTooLarge,
            Self::BodyTimeout(_) => Code::RequestTimeout,
            Self::TooManyMessages { .. } => Code::PayloadTooLarge,
            Self::HeadersTooLarge { .. } => Code::HeadersTooLarge,
            // A TTL expiry is contention, not absence: 429, as upstream v0.10.
            Self::Flow(e) if e.is_capacity() => Code::ResourceExhausted,
            Self::Flow(crate::director::flowcontrol::FlowError::Expired(_)) => {
                Code::ResourceExhausted
            }
            Self::Flow(_) => Code::ServiceUnavailable,
        }
    }

    /// Upstream's drop reason for a 429 or 503, `None` for every other error.
    pub(crate) fn dropped_reason(&self) -> Option<DroppedReason> {
        use crate::director::flowcontrol::FlowError;
        match self {
            Self::Director(DirectorError::NoCandidates(_)) => Some(DroppedReason::NoEndpoints),
            // As llm-d: no profile ran is no saturation (`header-profile-handler`).
            Self::Director(DirectorError::Schedule(ScheduleError::NoProfile(_))) => None,
            Self::Director(DirectorError::Schedule(_) | DirectorError::Shed(_)) => {
                Some(DroppedReason::Saturated)
            }
            Self::Flow(FlowError::Full { .. }) => Some(DroppedReason::Saturated),
            Self::Flow(FlowError::Expired(_)) => Some(DroppedReason::TtlExpired),
            Self::Flow(FlowError::Closed) => Some(DroppedReason::ShuttingDown),
            _ => None,
        }
    }
}

impl StreamError {
    /// The backpressure class of a 429/503, `None` for every other error.
    pub(crate) fn backpressure(&self) -> Option<Backpressure> {
        match self {
            Self::Director(DirectorError::NoCandidates(_)) => Some(Backpressure::NoReadyEndpoints),
            Self::Director(DirectorError::Schedule(ScheduleError::NoProfile(_))) => None,
            Self::Director(DirectorError::Schedule(_)) => Some(Backpressure::PoolSaturated),
            Self::Director(DirectorError::Shed(_)) => Some(Backpressure::ShedByPriority),
            // Flow control: the queue is full (429) or the request waited out its TTL (503);
            // either way the pool stayed saturated.
            Self::Flow(_) => Some(Backpressure::PoolSaturated),
            _ => None,
        }
    }
}

impl From<RequestError> for StreamError {
    fn from(e: RequestError) -> Self {
        Self::Director(DirectorError::BadRequest(e))
    }
}

/// The ImmediateResponse for `err`.
pub(crate) fn immediate(err: &StreamError) -> ProcessingResponse {
    let code = err.code();
    let message = format!("inference error: {} - {}", code.name(), err);
    let mut error =
        serde_json::json!({"message": message, "type": code.name(), "code": code.http_status()});
    let mut set_headers = vec![super::wire::set_header("content-type", "application/json")];
    if let Some(reason) = err.dropped_reason() {
        set_headers.push(super::wire::set_header(
            DROPPED_REASON_HEADER,
            reason.as_str(),
        ));
    }
    if let Some(bp) = err.backpressure() {
        error["reason"] = bp.reason().into();
        error["retry_after_seconds"] = bp.retry_after_secs().into();
        set_headers.push(super::wire::set_header(
            "retry-after",
            &bp.retry_after_secs().to_string(),
        ));
    }
    let body = serde_json::json!({ "error": error }).to_string();
    let headers = HeaderMutation {
        set_headers,
        remove_headers: Vec::new(),
    };
    let resp = ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(code.http_status()),
        }),
        headers: Some(headers),
        body: body.into_bytes(),
        details: format!("epp_{}", code.name()),
        ..Default::default()
    };
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(resp)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::ScheduleError;

    #[test]
    fn maps_every_error_class_to_its_status() {
        let cases = [
            (StreamError::from(RequestError::MissingModel), 400),
            (DirectorError::NoCandidates("x").into(), 503),
            (DirectorError::Screened.into(), 503),
            (
                DirectorError::Schedule(ScheduleError::AllFiltered).into(),
                429,
            ),
            (StreamError::BodyTooLarge { limit: 1 }, 413),
            (
                DirectorError::Shed(crate::admission::Shed {
                    priority: -1,
                    saturation: 1.0,
                })
                .into(),
                429,
            ),
            // llm-d-router v0.10 answers an admission plugin's refusal with 500.
            (
                DirectorError::NotAdmitted("probabilistic-admitter: rejected".into()).into(),
                500,
            ),
        ];
        for (err, status) in cases {
            assert_eq!(err.code().http_status(), status);
            let Some(Response::ImmediateResponse(r)) = immediate(&err).response else {
                panic!()
            };
            assert_eq!(r.status.unwrap().code, i32::from(status));
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("inference error: "),
                "{body}"
            );
            assert_eq!(body["error"]["code"], status);
        }
    }

    #[test]
    fn drop_reasons_and_statuses_are_upstreams() {
        use crate::director::flowcontrol::FlowError;
        let shed = crate::admission::Shed {
            priority: -1,
            saturation: 1.0,
        };
        let cases: Vec<(StreamError, u16, Option<&str>)> = vec![
            (
                DirectorError::NoCandidates("x").into(),
                503,
                Some("rejected-no-endpoints"),
            ),
            (DirectorError::Screened.into(), 503, None),
            (
                DirectorError::Schedule(ScheduleError::AllFiltered).into(),
                429,
                Some("rejected-saturated"),
            ),
            (
                DirectorError::Shed(shed).into(),
                429,
                Some("rejected-saturated"),
            ),
            (
                FlowError::Full {
                    limit: "requests",
                    value: 1,
                }
                .into(),
                429,
                Some("rejected-saturated"),
            ),
            (
                FlowError::Expired(std::time::Duration::from_secs(1)).into(),
                429,
                Some("rejected-ttl-expired"),
            ),
            (
                FlowError::Closed.into(),
                503,
                Some("rejected-shutting-down"),
            ),
            (DirectorError::NotCached.into(), 412, None),
            (StreamError::from(RequestError::MissingModel), 400, None),
            (StreamError::BodyTooLarge { limit: 1 }, 413, None),
        ];
        for (err, status, reason) in cases {
            let Some(Response::ImmediateResponse(r)) = immediate(&err).response else {
                panic!()
            };
            assert_eq!(r.status.unwrap().code, i32::from(status), "{err}");
            let got = r
                .headers
                .unwrap()
                .set_headers
                .into_iter()
                .filter_map(|h| h.header)
                .find(|h| h.key == DROPPED_REASON_HEADER)
                .map(|h| String::from_utf8(h.raw_value).unwrap());
            assert_eq!(got.as_deref(), reason, "{err}");
        }
    }

    #[test]
    fn backpressure_answers_say_why_and_when_to_retry() {
        let shed = crate::admission::Shed {
            priority: -1,
            saturation: 1.2,
        };
        let cases = [
            (
                StreamError::from(DirectorError::NoCandidates(
                    "no ready endpoints in the pool",
                )),
                503,
                "no_ready_endpoints",
                "5",
            ),
            (
                DirectorError::Schedule(ScheduleError::AllFiltered).into(),
                429,
                "pool_saturated",
                "1",
            ),
            (
                DirectorError::Shed(shed).into(),
                429,
                "shed_by_priority",
                "2",
            ),
        ];
        for (err, status, reason, retry) in cases {
            let Some(Response::ImmediateResponse(r)) = immediate(&err).response else {
                panic!()
            };
            assert_eq!(r.status.unwrap().code, status);
            let headers = r.headers.unwrap().set_headers;
            let value = |name: &str| {
                headers
                    .iter()
                    .find(|h| h.header.as_ref().unwrap().key == name)
                    .map(|h| {
                        String::from_utf8(h.header.as_ref().unwrap().raw_value.clone()).unwrap()
                    })
            };
            assert_eq!(value("retry-after").as_deref(), Some(retry), "{reason}");
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(body["error"]["reason"], reason);
            assert_eq!(body["error"]["retry_after_seconds"].to_string(), retry);
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&err.to_string()),
                "upstream text kept: {body}"
            );
        }
        let Some(Response::ImmediateResponse(r)) =
            immediate(&StreamError::from(RequestError::MissingModel)).response
        else {
            panic!()
        };
        assert!(
            r.headers
                .unwrap()
                .set_headers
                .iter()
                .all(|h| h.header.as_ref().unwrap().key != "retry-after"),
            "a 400 is not backpressure"
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(body["error"].get("reason").is_none());
    }
}
