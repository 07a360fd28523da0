//! One hostile request or file must not wedge, bloat or abort the server:
//! each row of the review in issue 57 as a regression test (the rows that
//! need the counting allocator are in `fuzz_tests`, the registry's in
//! `registry_tests`). Requests go through the router as `wllm serve` builds
//! it (no sockets); each must end, within a generous time limit that only a
//! hang would pass, in an OpenAI error naming the field, while a small
//! request beside it is still served.

mod common;

use std::time::Duration;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use serde_json::{Value, json};
use tower::ServiceExt;
use wllm::server::ServerConfig;

/// A router over a tiny model, and the runtime that drives it.
struct App {
    router: axum::Router,
    engine: wllm::Engine,
    rt: tokio::runtime::Runtime,
}

fn app(name: &str, spec: &TinySpec, cfg: ServerConfig) -> App {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "tiny.gguf", spec, &mut rng(5));
    let engine = wllm::Engine::new(&wllm::EngineConfig {
        model,
        kv_cache_memory: Some(2 << 20),
        max_model_len: Some(256),
        ..Default::default()
    })
    .unwrap();
    let router = wllm::server::router(
        engine.clone(),
        ServerConfig {
            served_model_name: "tiny".into(),
            ..cfg
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    App { router, engine, rt }
}

impl App {
    /// (status, body as JSON) of one request; a panic if it does not end
    /// within two minutes (a hung engine or handler).
    fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut req = axum::http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if method == "POST" {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(axum::body::Body::from(body.to_string())).unwrap();
        let router = self.router.clone();
        self.rt.block_on(async move {
            let r = tokio::time::timeout(Duration::from_secs(120), router.oneshot(req))
                .await
                .unwrap_or_else(|_| panic!("{method} {path} did not end within 120 s"))
                .unwrap();
            let st = r.status().as_u16();
            let b = axum::body::to_bytes(r.into_body(), 1 << 26).await.unwrap();
            let text = String::from_utf8_lossy(&b).to_string();
            (st, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        })
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("POST", path, &[], &body.to_string())
    }

    /// The 400 error object of `body`, naming `param`; its message.
    fn refused(&self, path: &str, body: &Value, param: &str) -> String {
        let (st, v) = self.post(path, body);
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["code"], "400", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        v["error"]["message"].as_str().unwrap().to_string()
    }

    /// A small completion is still served, and every block is free after it.
    fn still_serves(&self) {
        let (st, v) = self.post(
            "/v1/completions",
            &json!({"prompt": "he", "max_tokens": 2, "temperature": 0}),
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
        let b = self.engine.block_stats().unwrap();
        assert_eq!(b.num_free, b.num_blocks, "blocks leaked");
        assert!(b.consistent.is_ok(), "{:?}", b.consistent);
    }
}

/// Row 1: `prompt_lookup_max` of u64::MAX once spun the engine thread for ever.
#[test]
fn row_01_a_huge_prompt_lookup_is_refused_and_the_engine_goes_on() {
    let a = app("hostile_spec", &TinySpec::default(), ServerConfig::default());
    for spec in [
        json!({"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": u64::MAX, "adaptive": false}),
        json!({"method": "ngram", "num_speculative_tokens": u64::MAX}),
        json!({"prompt_lookup_max": 17}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "he he he he"}], "max_tokens": 4,
            "temperature": 0, "speculative_config": spec});
        let m = a.refused("/v1/chat/completions", &body, "speculative_config");
        assert!(m.contains("at most 16") || m.contains("1 to 64"), "{m}");
    }
    // At the bound, drafting runs and ends.
    let body = json!({"messages": [{"role": "user", "content": "he he he he he he"}], "max_tokens": 6,
        "temperature": 0, "speculative_config": {"prompt_lookup_min": 1, "prompt_lookup_max": 16, "adaptive": false}});
    let (st, v) = a.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{v}");
    a.still_serves();
}

/// Row 2: 1,000 stop strings of 3,000 bytes with n = 64 took 1.7 GB.
#[test]
fn row_02_stop_lists_past_their_bounds_are_refused() {
    let a = app("hostile_stop", &TinySpec::default(), ServerConfig::default());
    let long = "y".repeat(3000);
    let body = json!({"prompt": ["a", "b", "c", "d"], "n": 64, "max_tokens": 2,
        "stop": vec![long.clone(); 1000]});
    let m = a.refused("/v1/completions", &body, "stop");
    assert!(m.contains("at most 64 strings"), "{m}");
    let m = a.refused("/v1/completions", &json!({"prompt": "a", "stop": [long]}), "stop");
    assert!(m.contains("1024 bytes"), "{m}");
    let ids: Vec<u32> = (0..1025).collect();
    let m = a.refused(
        "/v1/completions",
        &json!({"prompt": "a", "stop_token_ids": ids}),
        "stop_token_ids",
    );
    assert!(m.contains("1024"), "{m}");
    // At the bounds, served.
    let stops: Vec<String> = (0..64).map(|i| format!("{i}{}", "z".repeat(1000))).collect();
    let (st, v) = a.post(
        "/v1/completions",
        &json!({"prompt": ["a", "b"], "n": 4, "max_tokens": 2, "stop": stops}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 8);
    a.still_serves();
}

/// Row 3: a 5 MB prompt was tokenized on a tokio worker (+1 GB, 3.8 s);
/// now a text longer than the context can hold is refused unread.
#[test]
fn row_03_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing() {
    let a = app("hostile_prompt", &TinySpec::default(), ServerConfig::default());
    let cap = a.engine.tokenizer().max_prompt_bytes(256);
    assert!(cap < (1 << 20), "{cap}");
    let big = "he ".repeat((5 << 20) / 3);
    let (st, v) = a.post("/v1/completions", &json!({"prompt": big, "max_tokens": 1}));
    assert_eq!(st, 400, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("bytes") && m.contains(&cap.to_string()), "{m}");
    let (st, v) = a.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": big}]}),
    );
    assert_eq!(st, 400, "{v}");
    let (st, v) = a.post("/v1/embeddings", &json!({"input": [big]}));
    assert_eq!(st, 400, "{v}");
    // Just under the cap is tokenized, then refused for its token count, not its bytes.
    let (st, v) = a.post("/v1/completions", &json!({"prompt": "h".repeat(cap), "max_tokens": 1}));
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("tokens"), "{v}");
    a.still_serves();
}

/// Row 4: `keep_alive: 1e20` panicked in the handler and dropped the connection.
#[test]
fn row_04_keep_alive_out_of_range_is_a_400() {
    let a = app("hostile_keepalive", &TinySpec::default(), ServerConfig::default());
    for ka in [
        json!(1e20),
        json!("1e20"),
        json!("inf"),
        json!("nan"),
        json!("99999999h"),
        json!("5 parsecs"),
    ] {
        let (st, v) = a.post(
            "/v1/completions",
            &json!({"prompt": "he", "max_tokens": 1, "keep_alive": ka}),
        );
        assert_eq!(st, 400, "{ka}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("keep_alive"), "{v}");
    }
    for ka in [json!(-1), json!("5m"), json!("1h30m"), json!(0)] {
        let (st, v) = a.post(
            "/v1/completions",
            &json!({"prompt": "he", "max_tokens": 1, "keep_alive": ka}),
        );
        assert_eq!(st, 200, "{ka}: {v}");
    }
    a.still_serves();
}

/// Row 9: a template that loops (or writes) without end rendered for ever
/// on a tokio worker; now it runs out of fuel, or hits the output cap.
#[test]
fn row_09_templates_that_never_end_run_out_of_fuel() {
    let loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x";
    let writes = "{% for i in range(100000) %}{{ 'x' * 30000 }}{% endfor %}";
    for (tpl, what) in [(loops, "instructions"), (writes, "bytes")] {
        let spec = TinySpec {
            chat_template: Some(tpl.into()),
            ..Default::default()
        };
        let a = app("hostile_template", &spec, ServerConfig::default());
        let problem = a.engine.tokenizer().template_budget_problem();
        assert!(problem.as_deref().is_some_and(|p| p.contains(what)), "{problem:?}");
        let m = a.refused(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
            "messages",
        );
        assert!(m.contains(what), "{m}");
        a.still_serves();
    }
    // The usual template renders within the budget.
    let a = app("hostile_template_ok", &TinySpec::default(), ServerConfig::default());
    assert_eq!(a.engine.tokenizer().template_budget_problem(), None);
}

/// Row 10: a schema was compiled once per sequence, on the engine thread;
/// now once per request, before it reaches the engine.
#[test]
fn row_10_a_requests_grammar_compiles_once_whatever_its_n() {
    let a = app("hostile_schema", &TinySpec::default(), ServerConfig::default());
    let props: serde_json::Map<String, Value> = (0..300)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let schema = json!({"type": "object", "properties": props});
    let before = a.engine.constraints_compiled();
    let body = json!({"prompt": "he", "n": 8, "max_tokens": 3, "temperature": 0.7, "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}});
    let (st, v) = a.post("/v1/completions", &body);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        a.engine.constraints_compiled() - before,
        1,
        "one compile for 8 sequences"
    );
    // A constraint past its size bound is refused before it compiles.
    let props: serde_json::Map<String, Value> = (0..5000)
        .map(|i| (format!("property{i}"), json!({"type": "integer"})))
        .collect();
    let body = json!({"prompt": "he", "response_format": {"type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object", "properties": props}}}});
    let before = a.engine.constraints_compiled();
    let m = a.refused("/v1/completions", &body, "response_format");
    assert!(m.contains("at most"), "{m}");
    assert_eq!(a.engine.constraints_compiled(), before);
    a.still_serves();
}

/// Row 12: without an API key, requests addressed to another site's name
/// (DNS rebinding) are refused; localhost names and IP addresses are not.
#[test]
fn row_12_hosts_other_than_localhost_need_a_key_or_a_listing() {
    let a = app(
        "hostile_host",
        &TinySpec::default(),
        ServerConfig {
            allowed_hosts: vec!["mybox.lan".into()],
            ..Default::default()
        },
    );
    for host in ["evil.example", "evil.example:8000", "localhost.evil.example"] {
        let (st, v) = a.call("GET", "/v1/models", &[("host", host)], "");
        assert_eq!(st, 421, "{host}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("--allowed-hosts"),
            "{v}"
        );
        let (st, _) = a.call("POST", "/v1/completions", &[("host", host)], r#"{"prompt": "he"}"#);
        assert_eq!(st, 421, "{host}");
    }
    for host in [
        "localhost:8000",
        "127.0.0.1:8000",
        "[::1]:8000",
        "mybox.lan",
        "192.168.1.9",
    ] {
        let (st, v) = a.call("GET", "/v1/models", &[("host", host)], "");
        assert_eq!(st, 200, "{host}: {v}");
    }
    // With a key, the key is what guards.
    let k = app(
        "hostile_host_key",
        &TinySpec::default(),
        ServerConfig {
            api_key: Some("k".into()),
            ..Default::default()
        },
    );
    let (st, _) = k.call("GET", "/v1/models", &[("host", "evil.example")], "");
    assert_eq!(st, 401);
    let (st, _) = k.call(
        "GET",
        "/v1/models",
        &[("host", "evil.example"), ("authorization", "Bearer k")],
        "",
    );
    assert_eq!(st, 200);
}

/// Row 13: shard names of a safetensors index must stay inside the folder.
#[test]
fn row_13_safetensors_shards_outside_the_model_folder_are_never_opened() {
    let dir = test_dir("hostile_shards");
    let outside = dir.join("outside");
    let model = dir.join("model");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(&model).unwrap();
    let data = vec![0u8; 16];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data).unwrap();
    let bytes = safetensors::serialize(vec![("w".to_string(), view)], None).unwrap();
    std::fs::write(outside.join("model.safetensors"), &bytes).unwrap();
    let abs = outside.join("model.safetensors").display().to_string();
    for name in ["../outside/model.safetensors", abs.as_str()] {
        let index = json!({"weight_map": {"w": name}});
        std::fs::write(model.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let e = wllm::model::safetensors::SafetensorsDir::open(&model)
            .err()
            .unwrap_or_else(|| panic!("{name} was opened"));
        assert!(e.to_string().contains("inside the model's folder"), "{e}");
    }
    // A shard inside is read.
    std::fs::write(model.join("part.safetensors"), &bytes).unwrap();
    std::fs::write(
        model.join("model.safetensors.index.json"),
        json!({"weight_map": {"w": "part.safetensors"}}).to_string(),
    )
    .unwrap();
    let st = wllm::model::safetensors::SafetensorsDir::open(&model).unwrap();
    assert!(st.tensors.contains_key("w"));
}

/// Row 7: a GGUF claiming 10^9 layers once took a 16 GB allocation in the
/// KV groups; now its config is refused before anything is sized.
#[test]
fn row_07_a_gguf_claiming_a_billion_layers_is_refused() {
    let dir = test_dir("hostile_layers");
    let path = write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(1));
    let mut b = std::fs::read(&path).unwrap();
    let key = b"llama.block_count";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // The key's value type (u32) then its value.
    assert_eq!(&b[at..at + 4], &4u32.to_le_bytes());
    b[at + 4..at + 8].copy_from_slice(&1_000_000_000u32.to_le_bytes());
    let bad = dir.join("billion.gguf");
    std::fs::write(&bad, &b).unwrap();
    let g = wllm::model::gguf::GgufFile::open(&bad).unwrap();
    let e = wllm::model::ModelConfig::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("block_count") && e.contains("1000000000"), "{e}");
    let e = wllm::Engine::new(&wllm::EngineConfig {
        model: bad.clone(),
        ..Default::default()
    })
    .err()
    .expect("refused");
    assert!(e.to_string().contains("block_count"), "{e}");
    // Fewer layers than its tensors hold is refused too (they must agree).
    b[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&bad, &b).unwrap();
    let g = wllm::model::gguf::GgufFile::open(&bad).unwrap();
    let e = wllm::model::ModelConfig::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("holds tensors of 2"), "{e}");
}
