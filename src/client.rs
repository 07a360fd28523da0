//! A small HTTP/1.1 client for OpenAI-compatible servers (plain http only): JSON
//! requests and SSE streams. `wllm bench serve --base-url` and the server tests
//! use it, so that any engine can be driven the same way.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

/// A failed HTTP exchange.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad URL {0:?}: only http://host:port/... is supported")]
    Url(String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("HTTP error: {0}")]
    Http(String),
}

fn http<E: std::fmt::Display>(e: E) -> ClientError {
    ClientError::Http(e.to_string())
}

/// Splits `http://host:port/path` into (host:port, path).
pub fn split_url(url: &str) -> Result<(String, String), ClientError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::Url(url.into()))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    Ok((hostport, path.to_string()))
}

/// An open response: status and a body read chunk by chunk.
pub struct Response {
    pub status: u16,
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

async fn send(method: &str, url: &str, body: Option<Bytes>) -> Result<Response, ClientError> {
    let (hostport, path) = split_url(url)?;
    let stream = tokio::net::TcpStream::connect(&hostport)
        .await
        .map_err(|e| ClientError::Connect(hostport.clone(), e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let bytes = body.unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", &hostport)
        .header("content-type", "application/json")
        .header("authorization", "Bearer wllm")
        .body(Full::new(bytes))
        .map_err(http)?;
    let resp = sender.send_request(req).await.map_err(http)?;
    Ok(Response {
        status: resp.status().as_u16(),
        body: resp.into_body(),
        buf: Vec::new(),
    })
}

/// GET, whole body.
pub async fn get(url: &str) -> Result<(u16, String), ClientError> {
    let mut r = send("GET", url, None).await?;
    let body = r.text().await?;
    Ok((r.status, body))
}

/// POST JSON, whole body parsed as JSON.
pub async fn post_json(url: &str, body: &serde_json::Value) -> Result<(u16, serde_json::Value), ClientError> {
    let mut r = send("POST", url, Some(Bytes::from(body.to_string()))).await?;
    let text = r.text().await?;
    let v =
        serde_json::from_str(&text).map_err(|e| ClientError::Http(format!("response is not JSON ({e}): {text}")))?;
    Ok((r.status, v))
}

/// POST JSON and keep the response open for streaming.
pub async fn post_stream(url: &str, body: &serde_json::Value) -> Result<Response, ClientError> {
    send("POST", url, Some(Bytes::from(body.to_string()))).await
}

/// POST raw bytes; whole body as text.
pub async fn post_raw(url: &str, body: &str) -> Result<(u16, String), ClientError> {
    let mut r = send("POST", url, Some(Bytes::from(body.to_string()))).await?;
    let text = r.text().await?;
    Ok((r.status, text))
}

impl Response {
    /// The rest of the body as text.
    pub async fn text(&mut self) -> Result<String, ClientError> {
        while let Some(f) = self.body.frame().await {
            if let Ok(d) = f.map_err(http)?.into_data() {
                self.buf.extend_from_slice(&d);
            }
        }
        Ok(String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned())
    }

    /// The next SSE `data:` payload, or `None` at the end of the body.
    pub async fn next_event(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..i + 2).collect();
                let text = String::from_utf8_lossy(&raw);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    return Ok(Some(data.join("\n")));
                }
                continue;
            }
            match self.body.frame().await {
                Some(f) => {
                    if let Ok(d) = f.map_err(http)?.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                None => return Ok(None),
            }
        }
    }
}
