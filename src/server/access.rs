//! Who may call the server: with `--api-key`, every `/v1` route (and
//! `/metrics` unless `--metrics-public`) needs `Authorization: Bearer KEY`,
//! compared in constant time (401 otherwise); `/health` stays open. With
//! `--allowed-origins`, browsers on those origins get CORS headers (and their
//! preflights an answer); without it no CORS header is ever sent, so no web
//! page can read a response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// Equal bytes, in time that depends on the lengths only.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

fn needs_key(s: &AppState, path: &str) -> bool {
    path.starts_with("/v1") || ((path == "/metrics" || path.starts_with("/engine/")) && !s.cfg.metrics_public)
}

/// The API-key check.
pub(crate) async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.cfg.api_key
        && req.method() != Method::OPTIONS
        && needs_key(&s, req.uri().path())
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !ct_eq(given.trim().as_bytes(), key.as_bytes()) {
            let mut r = ApiError {
                status: StatusCode::UNAUTHORIZED,
                kind: "authentication_error",
                message: "a valid API key is needed: send `Authorization: Bearer KEY`".into(),
                param: None,
            }
            .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

/// CORS for the origins `--allowed-origins` lists (`*` for any).
pub(crate) async fn cors(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allowed = origin.as_ref().and_then(|o| {
        let o = o.to_str().ok()?;
        s.cfg
            .allowed_origins
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
            .then(|| HeaderValue::from_str(o).ok())
            .flatten()
    });
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = match (&allowed, preflight) {
        (Some(_), true) => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("authorization, content-type"),
            );
            h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
            r
        }
        _ => next.run(req).await,
    };
    if let Some(o) = allowed {
        resp.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        resp.headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}
