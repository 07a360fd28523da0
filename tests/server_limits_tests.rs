//! A server you can leave running: fairness between requests, caps on
//! sequences, connections and bodies, timeouts, the API key, CORS, strict
//! input, and OpenAI error objects for every refusal. Each test drives a real
//! server over TCP with hand-written HTTP, so headers are exactly as sent.

mod common;

use std::time::{Duration, Instant};

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wllm::server::ServerConfig;
use wllm::{Engine, EngineConfig, LlmEngine};

struct Server {
    addr: std::net::SocketAddr,
    engine: Engine,
    rt: tokio::runtime::Runtime,
}

fn start(name: &str, cfg: ServerConfig, engine_cfg: impl FnOnce(&mut EngineConfig)) -> Server {
    start_with(name, cfg, engine_cfg, false)
}

/// As `start`, warmed up as `wllm serve` is (every pipeline the first steps
/// need is built before the server answers), so a test that counts steps or
/// waits on them does not wait on shader compilation.
fn start_warm(name: &str, cfg: ServerConfig, engine_cfg: impl FnOnce(&mut EngineConfig)) -> Server {
    start_with(name, cfg, engine_cfg, true)
}

fn start_with(name: &str, cfg: ServerConfig, engine_cfg: impl FnOnce(&mut EngineConfig), warm: bool) -> Server {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(3));
    let mut ec = EngineConfig {
        model,
        kv_cache_memory: Some(4096 * 512),
        max_model_len: Some(1024),
        ..Default::default()
    };
    engine_cfg(&mut ec);
    let mut core = LlmEngine::new(&ec).unwrap();
    if warm {
        assert!(core.warm_up().unwrap() > 0, "the warm-up ran no step");
    }
    let engine = Engine::from_core(core);
    let cfg = ServerConfig {
        served_model_name: "tiny".into(),
        ..cfg
    };
    let (rt, addr) = serve_in_background(&engine, cfg);
    Server { addr, engine, rt }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, head, body).
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// The body is an OpenAI error object with this status as its code.
fn openai_error(status: u16, body: &str) -> Value {
    // A chunked body arrives with its chunk sizes; take the JSON object in it.
    let start = body.find('{').unwrap_or_else(|| panic!("no JSON in {body:?}"));
    let end = body.rfind('}').unwrap() + 1;
    let v: Value = serde_json::from_str(&body[start..end]).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert_eq!(v["error"]["code"], status.to_string(), "{v}");
    v
}

#[test]
fn every_refusal_is_an_openai_error_object() {
    let s = start(
        "limits_errors",
        ServerConfig {
            max_body_bytes: 2048,
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        let body = r#"{"prompt": "hi", "max_tokens": 2}"#;
        // 415: no or a non-JSON content type (a "simple" cross-origin POST).
        for ct in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
            let h: Vec<(&str, &str)> = ct.map(|c| ("content-type", c)).into_iter().collect();
            let (st, _, b) = http(a, "POST", "/v1/completions", &h, body).await;
            assert_eq!(st, 415, "{ct:?}: {b}");
            openai_error(415, &b);
        }
        let (st, _, _) = http(a, "POST", "/v1/completions", &[("content-type", "application/json; charset=utf-8")], body).await;
        assert_eq!(st, 200);
        // 413 over the body limit.
        let big = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(4000));
        let (st, _, b) = http(a, "POST", "/v1/completions", &[JSON], &big).await;
        assert_eq!(st, 413, "{b}");
        openai_error(413, &b);
        // 405 on a wrong method, 404 on no route.
        for (m, p) in [("GET", "/v1/completions"), ("DELETE", "/v1/models"), ("PUT", "/v1/chat/completions")] {
            let (st, _, b) = http(a, m, p, &[], "").await;
            assert_eq!(st, 405, "{m} {p}: {b}");
            openai_error(405, &b);
        }
        let (st, _, b) = http(a, "GET", "/v2/anything", &[], "").await;
        assert_eq!(st, 404);
        openai_error(404, &b);
        // max_tokens that would wrap the length check.
        let (st, _, b) = http(a, "POST", "/v1/completions", &[JSON], r#"{"prompt": "hi", "max_tokens": 18446744073709551615}"#).await;
        assert_eq!(st, 400, "{b}");
        assert!(openai_error(400, &b)["error"]["message"].as_str().unwrap().contains("1024"));
        // Parameters wllm does not implement are named, not ignored; their
        // "unused" values pass.
        for (field, value) in [
            ("logit_bias", json!({"5": 10})),
            ("response_format", json!({"type": "xml"})),
            ("functions", json!([{"name": "f"}])),
            ("tool_choice", json!("required")),
            ("best_of", json!(3)),
        ] {
            let mut req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
            req[field] = value;
            let (st, _, b) = http(a, "POST", "/v1/chat/completions", &[JSON], &req.to_string()).await;
            assert_eq!(st, 400, "{field}: {b}");
            let v = openai_error(400, &b);
            assert!(v["error"]["message"].as_str().unwrap().contains(field), "{v}");
            assert_eq!(v["error"]["param"], field);
        }
        let ok = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "logit_bias": {}, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "functions": []});
        let (st, _, b) = http(a, "POST", "/v1/chat/completions", &[JSON], &ok.to_string()).await;
        assert_eq!(st, 200, "{b}");
        // Unknown roles.
        for role in ["wizard", "function", ""] {
            let req = json!({"messages": [{"role": role, "content": "hi"}], "max_tokens": 2});
            let (st, _, b) = http(a, "POST", "/v1/chat/completions", &[JSON], &req.to_string()).await;
            assert_eq!(st, 400, "{role}: {b}");
            assert!(openai_error(400, &b)["error"]["message"].as_str().unwrap().contains("role"));
        }
        let req = json!({"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 2});
        let (st, _, _) = http(a, "POST", "/v1/chat/completions", &[JSON], &req.to_string()).await;
        assert_eq!(st, 200);
    });
}

#[test]
fn sequences_not_requests_count_against_the_limits() {
    let s = start(
        "limits_seqs",
        ServerConfig {
            max_seqs_per_request: 16,
            max_pending_requests: 20,
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        // 4 prompts × n = 8 = 32 sequences: over the per-request cap.
        let req = json!({"prompt": ["a", "b", "c", "d"], "n": 8, "max_tokens": 1});
        let (st, _, b) = http(a, "POST", "/v1/completions", &[JSON], &req.to_string()).await;
        assert_eq!(st, 400, "{b}");
        let v = openai_error(400, &b);
        assert!(v["error"]["message"].as_str().unwrap().contains("32 sequences"), "{v}");
        // 16 sequences in flight (a slow request) leave room for 4 more, not 5.
        let slow = json!({"prompt": ["a", "b"], "n": 8, "max_tokens": 200, "ignore_eos": true});
        let big = tokio::spawn(async move { http(a, "POST", "/v1/completions", &[JSON], &slow.to_string()).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let five = json!({"prompt": "x", "n": 5, "max_tokens": 1});
        let (st, _, b) = http(a, "POST", "/v1/completions", &[JSON], &five.to_string()).await;
        assert_eq!(st, 503, "{b}");
        openai_error(503, &b);
        let four = json!({"prompt": "x", "n": 4, "max_tokens": 1});
        let (st, _, _) = http(a, "POST", "/v1/completions", &[JSON], &four.to_string()).await;
        assert_eq!(st, 200);
        assert_eq!(big.await.unwrap().0, 200);
    });
}

/// 64 prompts × n = 64 (4,096 sequences) and then a 2-token chat: the chat's
/// first token comes within a few engine steps, long before the big request ends.
#[test]
fn a_small_request_is_not_stuck_behind_a_large_one() {
    let s = start_warm(
        "limits_fair",
        ServerConfig {
            max_seqs_per_request: 4096,
            max_pending_requests: 8192,
            ..Default::default()
        },
        |c| c.max_num_seqs = 32,
    );
    let a = s.addr;
    let engine = s.engine.clone();
    s.rt.block_on(async {
        let prompts: Vec<String> = (0..64).map(|i| format!("request {i}")).collect();
        let req = json!({"prompt": prompts, "n": 64, "max_tokens": 4, "ignore_eos": true});
        let big = tokio::spawn(async move { http(a, "POST", "/v1/completions", &[JSON], &req.to_string()).await });
        // Wait until the big request fills the engine.
        let t0 = Instant::now();
        loop {
            let m = engine.metrics().unwrap();
            if m.num_requests_running >= 32 && m.num_requests_waiting > 1000 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the big request never filled the engine: {} running, {} waiting after {} steps",
                m.num_requests_running,
                m.num_requests_waiting,
                m.num_steps_total
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let steps0 = engine.metrics().unwrap().num_steps_total;
        let small = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let (st, _, b) = http(a, "POST", "/v1/chat/completions", &[JSON], &small.to_string()).await;
        assert_eq!(st, 200, "{b}");
        let m = engine.metrics().unwrap();
        let steps = m.num_steps_total - steps0;
        assert!(steps <= 6, "the small request took {steps} engine steps");
        assert!(m.num_requests_waiting > 500, "the big request had already drained");
        assert!(!big.is_finished());
        let (st, _, b) = big.await.unwrap();
        assert_eq!(st, 200);
        let v: Value = serde_json::from_str(&b[b.find('{').unwrap()..=b.rfind('}').unwrap()]).unwrap();
        assert_eq!(v["choices"].as_array().unwrap().len(), 4096);
    });
    let bs = s.engine.block_stats().unwrap();
    assert_eq!(bs.num_free, bs.num_blocks, "blocks leaked");
}

#[test]
fn idle_and_excess_connections_are_closed() {
    let s = start(
        "limits_conns",
        ServerConfig {
            max_connections: 100,
            head_timeout: Duration::from_secs(2),
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        // 300 clients connect and send nothing: at the cap of 100, each new
        // one closes the one idle longest, so the first 200 are closed and
        // the last 100 stay open.
        let mut idle = Vec::new();
        for _ in 0..300 {
            idle.push(TcpStream::connect(a).await.unwrap());
        }
        let mut gone = vec![false; idle.len()];
        let t = Instant::now();
        while gone.iter().filter(|&&g| g).count() < 200 && t.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for (c, g) in idle.iter_mut().zip(gone.iter_mut()).filter(|(_, g)| !**g) {
                let mut buf = [0u8; 64];
                *g = matches!(tokio::time::timeout(Duration::from_millis(1), c.read(&mut buf)).await, Ok(Ok(0)));
            }
        }
        // (The 2 s head timeout closes the rest too where this machine is slow.)
        let ended = gone.iter().filter(|&&g| g).count();
        assert!(ended >= 200, "{ended} of 300 idle connections were closed");
        // (Connections register as their tasks start, in about the order they came.)
        let first = gone[..200].iter().filter(|&&g| g).count();
        assert!(first >= 190, "the ones idle longest go first: {first} of the first 200 closed");
        // A new client is answered all the same.
        let (st, _, _) = http(a, "GET", "/health", &[], "").await;
        assert_eq!(st, 200);
        // 100 clients busy (a request head sent, its body not yet): the
        // next one gets a 503 and is closed; no busy one is.
        let mut busy = Vec::new();
        for _ in 0..100 {
            let mut c = TcpStream::connect(a).await.unwrap();
            c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
                .await
                .unwrap();
            busy.push(c);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut late = TcpStream::connect(a).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), late.read_to_end(&mut buf)).await;
        assert!(buf.starts_with(b"HTTP/1.1 503"), "{}", String::from_utf8_lossy(&buf));
        for c in busy.iter_mut() {
            let mut b = [0u8; 64];
            let r = tokio::time::timeout(Duration::from_millis(5), c.read(&mut b)).await;
            assert!(r.is_err(), "a busy connection was answered or closed: {r:?}");
        }
        drop(busy);
        // After the head timeout every idle connection is closed and the
        // server answers again.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let mut closed = 0;
        for c in idle.iter_mut() {
            let mut buf = [0u8; 256];
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf)).await {
                closed += 1;
            }
        }
        assert_eq!(closed, 300, "idle connections still open");
        let (st, _, _) = http(a, "GET", "/health", &[], "").await;
        assert_eq!(st, 200);
        // A client that sends half a head is cut off too.
        let mut slow = TcpStream::connect(a).await.unwrap();
        slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\n")
            .await
            .unwrap();
        let t = Instant::now();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
        assert!(t.elapsed() < Duration::from_secs(5), "a slow head was not cut off");
    });
    // The soft open-file limit is raised to the hard one.
    let soft = wllm::server::listener::raise_nofile_limit().unwrap();
    assert!(soft >= 1024, "{soft}");
}

#[test]
fn the_api_key_guards_v1_and_metrics_and_cors_is_opt_in() {
    let s = start(
        "limits_key",
        ServerConfig {
            api_key: Some("s3cret".into()),
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        let body = r#"{"prompt": "hi", "max_tokens": 2}"#;
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cre"),
            Some("s3cret"),
            Some("Basic s3cret"),
        ] {
            let mut h = vec![JSON];
            if let Some(v) = auth {
                h.push(("authorization", v));
            }
            let (st, head, b) = http(a, "POST", "/v1/completions", &h, body).await;
            assert_eq!(st, 401, "{auth:?}");
            assert!(head.contains("www-authenticate: bearer"), "{head}");
            assert_eq!(openai_error(401, &b)["error"]["type"], "authentication_error");
        }
        let key = ("authorization", "Bearer s3cret");
        let (st, _, _) = http(a, "POST", "/v1/completions", &[JSON, key], body).await;
        assert_eq!(st, 200);
        for p in ["/v1/models", "/v1/models/tiny", "/metrics"] {
            assert_eq!(http(a, "GET", p, &[], "").await.0, 401, "{p}");
            assert_eq!(http(a, "GET", p, &[key], "").await.0, 200, "{p}");
        }
        assert_eq!(http(a, "GET", "/health", &[], "").await.0, 200);
        // No CORS header for any origin by default, preflight or not.
        let pre = [
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
        ];
        let (_, head, _) = http(a, "OPTIONS", "/v1/completions", &pre, "").await;
        assert!(!head.contains("access-control-allow-origin"), "{head}");
        let (_, head, _) = http(a, "GET", "/v1/models", &[("origin", "http://evil.example"), key], "").await;
        assert!(!head.contains("access-control-allow-origin"), "{head}");
    });
    let s = start(
        "limits_cors",
        ServerConfig {
            allowed_origins: vec!["http://app.example".into()],
            metrics_public: true,
            api_key: Some("k".into()),
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        assert_eq!(http(a, "GET", "/metrics", &[], "").await.0, 200, "--metrics-public");
        let pre = |o| [("origin", o), ("access-control-request-method", "POST")];
        let (st, head, _) = http(a, "OPTIONS", "/v1/completions", &pre("http://app.example"), "").await;
        assert_eq!(st, 204);
        assert!(
            head.contains("access-control-allow-origin: http://app.example"),
            "{head}"
        );
        assert!(head.contains("authorization"), "{head}");
        let (_, head, _) = http(a, "OPTIONS", "/v1/completions", &pre("http://evil.example"), "").await;
        assert!(!head.contains("access-control-allow-origin"), "{head}");
        let (st, head, _) = http(
            a,
            "GET",
            "/v1/models",
            &[("origin", "http://app.example"), ("authorization", "Bearer k")],
            "",
        )
        .await;
        assert_eq!(st, 200);
        assert!(
            head.contains("access-control-allow-origin: http://app.example"),
            "{head}"
        );
    });
}

#[test]
fn constant_time_compare_is_equality() {
    use wllm::server::ct_eq;
    assert!(ct_eq(b"abc", b"abc"));
    assert!(!ct_eq(b"abc", b"abd"));
    assert!(!ct_eq(b"abc", b"ab"));
    assert!(!ct_eq(b"", b"a"));
    assert!(ct_eq(b"", b""));
}

/// Sends `head` and then `parts` of the body with a pause before each, never
/// finishing it; returns the status and body of the answer and how long it
/// took (the answer must come before the body ends: it never does).
async fn answer_to_unfinished_body(
    addr: std::net::SocketAddr,
    head: &str,
    parts: &[Vec<u8>],
) -> (u16, String, Duration) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    s.write_all(head.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let parts = parts.to_vec();
    let sender = tokio::spawn(async move {
        for p in parts {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr.write_all(&p).await.is_err() {
                break;
            }
        }
        // Hold the connection open, the body unfinished.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(wr);
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the answer's JSON is complete (or the connection ends).
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&out);
            if text.contains("\r\n\r\n") && text.trim_end().ends_with('}') || text.ends_with("0\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let took = t.elapsed();
    sender.abort();
    let text = String::from_utf8_lossy(&out).to_string();
    let (h, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = h.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, body.to_string(), took)
}

/// A body over the limit gets its 413 (an OpenAI error object) at once, not
/// after the body timeout, however the client sends it: a Content-Length
/// over the limit is refused before any of the body is read; a chunked body
/// (no Content-Length) as soon as what arrived passes the limit; both while
/// the client is still sending.
#[test]
fn a_body_over_the_limit_is_refused_promptly_however_it_is_sent() {
    let s = start(
        "limits_slow_body",
        ServerConfig {
            max_body_bytes: 2048,
            body_timeout: Duration::from_secs(30),
            ..Default::default()
        },
        |_| {},
    );
    let a = s.addr;
    s.rt.block_on(async {
        // Content-Length of 10 MB, a trickle of it.
        let head = "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\n\r\n";
        let parts: Vec<Vec<u8>> = (0..20).map(|_| vec![b' '; 50]).collect();
        let (st, body, took) = answer_to_unfinished_body(a, head, &parts).await;
        assert_eq!(st, 413, "{body}");
        openai_error(413, &body);
        assert!(took < Duration::from_secs(3), "the 413 took {took:?}");
        // Chunked, slowly: 1,500 bytes, then 1,500 more (past the limit), then nothing.
        let head = "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let chunk = |n: usize| {
            let mut c = format!("{n:x}\r\n").into_bytes();
            c.extend(std::iter::repeat_n(b' ', n));
            c.extend_from_slice(b"\r\n");
            c
        };
        let (st, body, took) = answer_to_unfinished_body(a, head, &[chunk(1500), chunk(1500), chunk(1500)]).await;
        assert_eq!(st, 413, "{body}");
        openai_error(413, &body);
        assert!(took < Duration::from_secs(3), "the 413 took {took:?}");
        // A body under the limit sent slowly is read to the end and answered.
        let req = r#"{"prompt": "hi", "max_tokens": 2}"#;
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            req.len()
        );
        let parts: Vec<Vec<u8>> = req.as_bytes().chunks(8).map(<[u8]>::to_vec).collect();
        let (st, body, _) = answer_to_unfinished_body(a, &head, &parts).await;
        assert_eq!(st, 200, "{body}");
    });
}

/// A `wllm serve` process on the tiny model at a free local port (not yet
/// started), and its address.
#[cfg(target_os = "linux")]
fn serve_command(name: &str, max_model_len: &str) -> (std::process::Command, std::net::SocketAddr) {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(3));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wllm"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--model"])
        .arg(&model)
        .args(["--kv-cache-memory", "2097152", "--max-model-len", max_model_len])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    (cmd, format!("127.0.0.1:{port}").parse().unwrap())
}

/// Waits (at most 120 s) until the server at `a` answers /health.
#[cfg(target_os = "linux")]
async fn wait_serving(a: std::net::SocketAddr) {
    let t = Instant::now();
    loop {
        if TcpStream::connect(a).await.is_ok()
            && let Ok((200, _, _)) =
                tokio::time::timeout(Duration::from_secs(5), http(a, "GET", "/health", &[], "")).await
        {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "wllm serve did not start");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Under systemd's default open-file limit (soft and hard both 1,024, so
/// the server cannot raise it), 1,073 idle sockets do not stop a new client
/// from being answered: the server caps its connections below the limit and
/// closes the ones idle longest to make room. `wllm serve` runs as its own
/// process under that limit; its descriptors stay below it throughout.
#[cfg(target_os = "linux")]
#[test]
fn idle_sockets_past_the_open_file_limit_do_not_lock_out_a_new_client() {
    use std::os::unix::process::CommandExt;
    let (mut cmd, a) = serve_command("limits_nofile", "256");
    // SAFETY: the closure runs in the forked child before exec and calls
    // only setrlimit, which is async-signal-safe, on a local struct.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Kill(cmd.spawn().expect("start wllm serve"));
    let pid = server.0.id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    // This process holds the 1,073 sockets: its own limit raised.
    let ours = wllm::server::listener::raise_nofile_limit().unwrap_or(0);
    assert!(
        ours >= 1200,
        "this test needs 1,200 descriptors; the hard limit is {ours}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        wait_serving(a).await;
        let mut idle = Vec::new();
        let mut most = 0;
        for i in 0..1073 {
            idle.push(TcpStream::connect(a).await.unwrap());
            if i % 100 == 0 {
                most = most.max(fds());
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        most = most.max(fds());
        assert!(most < 1024, "the server held {most} descriptors");
        let body = r#"{"prompt": [1, 2, 3], "max_tokens": 2}"#;
        let t = Instant::now();
        let (st, _, b) = tokio::time::timeout(
            Duration::from_secs(30),
            http(a, "POST", "/v1/completions", &[JSON], body),
        )
        .await
        .expect("a new client was not answered");
        assert_eq!(st, 200, "{b}");
        eprintln!(
            "answered in {:?} beside 1,073 idle sockets; the server held at most {most} descriptors",
            t.elapsed()
        );
        drop(idle);
    });
}

/// SIGTERM (what Kubernetes and systemd send) stops `wllm serve` gracefully:
/// a stream in progress runs to its end, new connections are refused, and
/// the process exits 0 once it is done. Before, SIGTERM killed the process
/// with the stream half sent.
#[cfg(target_os = "linux")]
#[test]
fn sigterm_lets_the_stream_in_progress_finish() {
    let (mut cmd, a) = serve_command("limits_sigterm", "512");
    let mut child = cmd.spawn().expect("start wllm serve");
    let pid = child.id() as i32;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (events, ended) = rt.block_on(async {
        wait_serving(a).await;
        let body = r#"{"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": true, "stream": true}"#;
        let mut s = TcpStream::connect(a).await.unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        // The first event, then SIGTERM.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("data: {") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended before its first event");
            got.extend_from_slice(&buf[..n]);
        }
        // SAFETY: kill sends a signal to the child this test started; no memory is involved.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused = TcpStream::connect(a).await.is_err();
        let ended = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut got)).await;
        assert!(ended.is_ok(), "the stream did not end within 60 s of SIGTERM");
        let text = String::from_utf8_lossy(&got).to_string();
        let events = text.matches("data: {").count();
        (events, (text.contains("data: [DONE]"), refused))
    });
    let (done, refused) = ended;
    assert!(done, "the stream was cut off by SIGTERM after {events} events");
    assert!(events >= 100, "only {events} events before [DONE]");
    assert!(refused, "a new connection was accepted after SIGTERM");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "wllm serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "wllm serve exited with {status} after SIGTERM");
}
