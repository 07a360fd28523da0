//! Who may call the server: with `--api-key`, every `/v1` route (and
//! `/metrics` unless `--metrics-public`) needs `Authorization: Bearer KEY`,
//! compared in constant time (401 otherwise); `/health` stays open. With
//! `--allowed-origins`, browsers on those origins get CORS headers (and their
//! preflights an answer); without it no CORS header is ever sent, so no web
//! page can read a response. Without `--api-key`, a request addressed to a
//! host name other than localhost's (or one `--allowed-hosts` lists) is
//! refused (421), so that a page whose domain is re-pointed at 127.0.0.1
//! (DNS rebinding) cannot use the server as its own origin.

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

/// Whether a request's `Host` may reach this server without an API key:
/// no header (not a browser), an IP address (a page cannot be served from
/// someone else's address, so no rebinding), `localhost` and its
/// subdomains, or a name `allowed` lists (`*.suffix` for its subdomains,
/// `*` for any). The port is ignored.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host.map(str::trim) else {
        return true;
    };
    // "[::1]:8000", "127.0.0.1:8000", "name:8000".
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, _)) => ip,
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                n
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed.iter().any(|a| {
            let a = a.trim().trim_end_matches('.').to_ascii_lowercase();
            match a.strip_prefix("*.") {
                Some(suffix) => name.ends_with(&format!(".{suffix}")),
                None => a == "*" || a == name,
            }
        })
}

/// The Host check (only without an API key: with one, a rebound page still lacks the key).
pub(crate) async fn host_check(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if s.cfg.api_key.is_none() {
        let host = req.headers().get(header::HOST).map(|h| h.to_str().unwrap_or("\u{0}"));
        if !host_allowed(host, &s.cfg.allowed_hosts) {
            return ApiError {
                status: StatusCode::MISDIRECTED_REQUEST,
                kind: "invalid_request_error",
                message: format!(
                    "this server does not answer requests for host {:?}: without --api-key it answers localhost \
                     and IP addresses only (a guard against DNS rebinding); start it with --allowed-hosts NAME \
                     or --api-key KEY",
                    host.unwrap_or_default()
                ),
                param: None,
            }
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn hosts_without_a_key_are_localhost_ip_addresses_or_listed() {
        let none: Vec<String> = Vec::new();
        for ok in [
            None,
            Some("localhost"),
            Some("localhost:8000"),
            Some("LOCALHOST."),
            Some("app.localhost:3000"),
            Some("127.0.0.1:8000"),
            Some("10.1.2.3"),
            Some("[::1]:8000"),
            Some("[fe80::1]"),
        ] {
            assert!(host_allowed(ok, &none), "{ok:?}");
        }
        for bad in [
            Some("evil.example.com"),
            Some("evil.example.com:8000"),
            Some("localhost.evil.com"),
            Some("x"),
            Some("[::1"),
            Some(""),
        ] {
            assert!(!host_allowed(bad, &none), "{bad:?}");
        }
        let listed = vec!["mybox.lan".to_string()];
        assert!(host_allowed(Some("MyBox.lan:8000"), &listed));
        assert!(!host_allowed(Some("other.lan"), &listed));
        assert!(host_allowed(Some("anything.example"), &["*".to_string()]));
        let suffix = vec!["*.svc.cluster.local".to_string()];
        assert!(host_allowed(Some("wllm.default.svc.cluster.local:8000"), &suffix));
        assert!(!host_allowed(Some("svc.cluster.local.evil.example"), &suffix));
    }
}
