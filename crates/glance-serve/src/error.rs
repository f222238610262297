//! Errors of the server, each with its HTTP status and an OpenAI-style JSON body:
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! Bad input is a 4xx (400, 404 for an unknown model, 408 for a body that never arrives, 413 for
//! an oversized body or image file), overload a 503; only a fault of glance itself is a 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error answer of the API.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error `type` (`invalid_request_error`, …).
    pub kind: &'static str,
    /// A short machine-readable code (`model_not_found`, `overloaded`, …).
    pub code: Option<&'static str>,
    /// The request field at fault, when known.
    pub param: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
        }
    }

    /// 400: the request is malformed or asks for something glance cannot do.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    /// The same error naming `param` as the field at fault (unless it names one already).
    pub fn with_param(mut self, param: &str) -> Self {
        if self.param.is_none() {
            self.param = Some(param.to_string());
        }
        self
    }

    /// 401: the server requires an API key and the request does not carry it.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        }
    }

    /// 404: no such route or model.
    pub fn not_found(message: impl Into<String>, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    /// 408: the client did not send its body in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self {
            code: Some("request_timeout"),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                message,
            )
        }
    }

    /// 413: the body (or an image in it) is larger than the server accepts.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self {
            code: Some("payload_too_large"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
            )
        }
    }

    /// 503: every slot is busy and the queue is full.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            code: Some("overloaded"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                message,
            )
        }
    }

    /// 500: a fault of the server (a broken model, a tensor error).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<glance_core::Error> for ApiError {
    /// Input faults are the client's (4xx); a broken checkpoint or a tensor failure is ours (500).
    fn from(e: glance_core::Error) -> Self {
        use glance_core::Error as E;
        let message = e.to_string();
        match e {
            E::Input(_)
            | E::InvalidParam(_)
            | E::Image(_)
            | E::PromptTooLong { .. }
            | E::Tokenizer(_)
            | E::Template(_)
            | E::Json { .. }
            // A file the client named under --allow-local-files, or a strategy the server cannot
            // run (e.g. `vispec` without a draft head).
            | E::Io { .. }
            | E::Config(_) => Self::bad_request(message),
            E::TooLarge { .. } => Self::too_large(message),
            E::MissingFile { .. }
            | E::MissingTensor { .. }
            | E::ShapeMismatch { .. }
            | E::Safetensors { .. }
            | E::NonFinite(_)
            | E::Candle(_) => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (glance_core::Error::Input("x".into()), 400),
            (glance_core::Error::Image("corrupt".into()), 400),
            (glance_core::Error::PromptTooLong { len: 9, max: 8 }, 400),
            (
                glance_core::Error::TooLarge {
                    path: "data:".into(),
                    what: "an image".into(),
                    limit: 1,
                },
                413,
            ),
            (glance_core::Error::NonFinite("logits".into()), 500),
        ];
        for (e, status) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status.as_u16(), status, "{a}");
            assert_eq!(a.body()["error"]["message"], a.message);
        }
        let o = ApiError::overloaded("full");
        assert_eq!(o.status.as_u16(), 503);
        assert_eq!(o.body()["error"]["code"], "overloaded");
    }
}
