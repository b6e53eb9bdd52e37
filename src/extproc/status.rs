//! The one place where errors become wire answers: HTTP status, body text, `details` for
//! Envoy's access log, and the `error_code` metric label.
//!
//! Bodies are OpenAI-shaped JSON whose message is upstream's text, so both OpenAI clients and
//! tools matching upstream's `inference error: <Code> - <message>` understand them:
//! `{"error":{"message":"inference error: BadRequest - ...","type":"BadRequest","code":400}}`.

use crate::director::DirectorError;
use crate::request::RequestError;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{HeaderMutation, ImmediateResponse, ProcessingResponse};

/// Upstream's error codes (`pkg/common/error/error.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    BadRequest,
    ResourceExhausted,
    ServiceUnavailable,
    Internal,
    RequestTimeout,
    PayloadTooLarge,
}

impl Code {
    pub fn http_status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::RequestTimeout => 408,
            Self::PayloadTooLarge => 413,
            Self::ResourceExhausted => 429,
            Self::Internal => 500,
            Self::ServiceUnavailable => 503,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequest",
            Self::RequestTimeout => "RequestTimeout",
            Self::PayloadTooLarge => "PayloadTooLarge",
            Self::ResourceExhausted => "ResourceExhausted",
            Self::Internal => "Internal",
            Self::ServiceUnavailable => "ServiceUnavailable",
        }
    }
}

/// Errors that end a stream before routing, besides the director's.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Director(#[from] DirectorError),
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("request body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
}

impl StreamError {
    pub fn code(&self) -> Code {
        match self {
            Self::Director(DirectorError::BadRequest(_)) => Code::BadRequest,
            Self::Director(DirectorError::NoCandidates(_)) => Code::ServiceUnavailable,
            Self::Director(DirectorError::Schedule(_)) => Code::ResourceExhausted,
            Self::Director(DirectorError::Shed(_)) => Code::ResourceExhausted,
            Self::Director(DirectorError::UnknownEndpoint(_)) => Code::Internal,
            Self::BodyTooLarge { .. } => Code::PayloadTooLarge,
            Self::BodyTimeout(_) => Code::RequestTimeout,
        }
    }
}

impl From<RequestError> for StreamError {
    fn from(e: RequestError) -> Self {
        Self::Director(DirectorError::BadRequest(e))
    }
}

/// The ImmediateResponse for `err`.
pub fn immediate(err: &StreamError) -> ProcessingResponse {
    let code = err.code();
    let message = format!("inference error: {} - {}", code.name(), err);
    let body = serde_json::json!({"error": {"message": message, "type": code.name(), "code": code.http_status()}}).to_string();
    let headers = HeaderMutation { set_headers: vec![super::wire::set_header("content-type", "application/json")], remove_headers: Vec::new() };
    let resp = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(code.http_status()) }),
        headers: Some(headers),
        body: body.into_bytes(),
        details: format!("epp_{}", code.name()),
        ..Default::default()
    };
    ProcessingResponse { response: Some(Response::ImmediateResponse(resp)), ..Default::default() }
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
            (DirectorError::Schedule(ScheduleError::AllFiltered).into(), 429),
            (StreamError::BodyTooLarge { limit: 1 }, 413),
            (DirectorError::Shed(crate::admission::Shed { priority: -1, saturation: 1.0 }).into(), 429),
        ];
        for (err, status) in cases {
            assert_eq!(err.code().http_status(), status);
            let Some(Response::ImmediateResponse(r)) = immediate(&err).response else { panic!() };
            assert_eq!(r.status.unwrap().code, i32::from(status));
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert!(body["error"]["message"].as_str().unwrap().starts_with("inference error: "), "{body}");
            assert_eq!(body["error"]["code"], status);
        }
    }
}
