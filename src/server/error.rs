//! Errors as OpenAI's error object with the matching HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::protocol::{ErrorBody, ErrorObject};
use crate::EngineError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(String::from),
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: message.into(),
            param: Some("model".into()),
        }
    }
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_overloaded",
            message: message.into(),
            param: None,
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::PromptTooLong { .. } => Self::bad_request(e.to_string(), Some("prompt")),
            EngineError::Params(crate::sampling::InvalidParams(field, _)) => {
                Self::bad_request(e.to_string(), Some(field))
            }
            EngineError::Tokenizer(crate::tokenizer::TokenizerError::PromptTooLarge { .. }) => {
                Self::bad_request(e.to_string(), Some("prompt"))
            }
            EngineError::Tokenizer(
                crate::tokenizer::TokenizerError::Template(_)
                | crate::tokenizer::TokenizerError::TemplateOutOfFuel
                | crate::tokenizer::TokenizerError::TemplateTooLarge(_)
                | crate::tokenizer::TokenizerError::NoTemplate,
            ) => Self::bad_request(e.to_string(), Some("messages")),
            EngineError::InvalidRequest(_) | EngineError::Tokenizer(_) => Self::bad_request(e.to_string(), None),
            EngineError::Stopped | EngineError::Busy(_) => Self::overloaded(e.to_string()),
            EngineError::OverBudget(m) => Self {
                status: StatusCode::INSUFFICIENT_STORAGE,
                kind: "insufficient_storage",
                message: m,
                param: Some("model".into()),
            },
            other => Self::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorObject {
                message: self.message,
                kind: self.kind.to_string(),
                param: self.param,
                code: Some(self.status.as_u16().to_string()),
            },
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        // The unread rest of a body too large or too slow is not waited for:
        // the connection ends after this answer.
        if matches!(self.status, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT) {
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}
