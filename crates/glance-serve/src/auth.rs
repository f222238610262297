//! `--api-key` / `GLANCE_API_KEY`: every API route requires `Authorization: Bearer KEY`
//! (`/health` and `/metrics` stay open for load balancers and Prometheus). The key is compared in
//! time that does not depend on where the first differing byte is.

use crate::error::ApiError;
use crate::App;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// The server's API key (never printed: its `Debug` is redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key; empty or whitespace-bearing keys are refused (a `Bearer` header cannot carry them).
    pub fn new(key: &str) -> Result<Self, String> {
        if key.is_empty() || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(
                "the API key must be non-empty, without spaces or control characters".into(),
            );
        }
        Ok(Self(key.to_string()))
    }

    /// Whether the `Authorization` header value presents this key.
    pub fn admits(&self, header: Option<&str>) -> bool {
        let given = header
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("");
        constant_time_eq(given.as_bytes(), self.0.as_bytes())
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

/// Byte-wise equality whose running time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// The middleware of the API routes: a 401 unless the request carries the key.
pub async fn require_key(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(key) = &app.config.api_key {
        let header = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !key.admits(header) {
            return Err(ApiError::unauthorized(
                "a valid API key is required: send `Authorization: Bearer KEY`",
            ));
        }
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_compared_whole() {
        let k = ApiKey::new("s3cret").unwrap();
        assert!(k.admits(Some("Bearer s3cret")));
        for bad in [
            None,
            Some("s3cret"),
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Bearer S3cret"),
            Some("Bearer "),
        ] {
            assert!(!k.admits(bad), "{bad:?}");
        }
        assert!(ApiKey::new("").is_err() && ApiKey::new("a b").is_err());
        assert_eq!(format!("{k:?}"), "ApiKey(…)");
    }
}
