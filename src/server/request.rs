//! Reading a request body as the API accepts it: `Content-Type:
//! application/json` (else 415, so that a web page cannot make a "simple"
//! cross-origin POST), at most `max_body_bytes` (413 at once: for a declared
//! length over it before reading, else as soon as what arrived passes it),
//! read within
//! `body_timeout` (408); then parsed as JSON and checked for parameters wllm
//! does not implement (a 400 naming them, never silently ignored).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;

/// The body of a JSON POST, within the server's limits.
pub async fn json_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mime = ct.split(';').next().unwrap_or_default().trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            kind: "invalid_request_error",
            message: format!(
                "Content-Type must be application/json, got {:?}",
                if ct.is_empty() { "nothing" } else { ct }
            ),
            param: None,
        });
    }
    let limit = s.cfg.max_body_bytes;
    // A declared length over the limit is refused before any of it is read.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        return Err(too_large(format!(
            "the request body ({n} bytes) is over the limit of {limit} bytes"
        )));
    }
    let bytes: Bytes = match tokio::time::timeout(s.cfg.body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return Err(ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                kind: "invalid_request_error",
                message: format!("the request body did not arrive within {:?}", s.cfg.body_timeout),
                param: None,
            });
        }
        Ok(Err(e)) => {
            return Err(too_large(format!(
                "the request body is over the limit of {limit} bytes ({e})"
            )));
        }
        Ok(Ok(b)) => b,
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed request body: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object", None));
    }
    unsupported(&v)?;
    Ok(v)
}

/// A 413. The server closes the connection after it (`server::listener`
/// sees the `connection: close`), the rest of the body unread.
fn too_large(message: String) -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        kind: "invalid_request_error",
        message,
        param: None,
    }
}

/// Parameters OpenAI or vLLM define that wllm does not implement yet, with
/// the values that mean "not used" (those pass). (`response_format` and
/// `structured_outputs` are `server::structured`'s.)
fn unsupported(v: &Value) -> Result<(), ApiError> {
    let unused = |k: &str, x: &Value| match k {
        "logit_bias" => x.as_object().is_some_and(|m| m.is_empty()),
        "functions" => x.as_array().is_some_and(|a| a.is_empty()),
        "function_call" => x == "none",
        "suffix" => x.as_str().is_some_and(str::is_empty),
        "echo" => x == false,
        "best_of" => x == 1,
        _ => false,
    };
    let keys = [
        "logit_bias",
        "functions",
        "function_call",
        "suffix",
        "echo",
        "best_of",
        "prompt_logprobs",
    ];
    let bad: Vec<&str> = keys
        .into_iter()
        .filter(|k| v.get(k).is_some_and(|x| !x.is_null() && !unused(k, x)))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            format!(
                "wllm does not support {} yet; remove {}",
                bad.join(", "),
                if bad.len() == 1 { "it" } else { "them" }
            ),
            Some(bad[0]),
        ))
    }
}
