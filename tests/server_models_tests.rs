//! `wllm serve` with several models (`ServerConfig::models`): `/v1/models`
//! lists each with its state, a request's `model` routes it (a model not yet
//! loaded loads for it) and its output is the model's own, the load and
//! unload endpoints work and refuse what they must, `/metrics` has each
//! loaded model's series under its `model_name` with one HELP a family, and
//! embeddings route too; the loads and unloads are in the primary engine's
//! step trace.

mod common;

use std::sync::Arc;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use serde_json::{Value, json};
use wllm::client::{get, post_json};
use wllm::engine::ModelRegistry;
use wllm::server::ServerConfig;
use wllm::{Engine, EngineConfig, Prompt, SamplingParams};

fn cfg(model: std::path::PathBuf) -> EngineConfig {
    EngineConfig {
        model,
        kv_cache_memory: Some(4096 * 512),
        max_model_len: Some(1024),
        ..Default::default()
    }
}

fn solo(engine: &Engine, prompt: &str) -> String {
    let s = SamplingParams {
        max_tokens: Some(8),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    engine
        .generate(Prompt::Text(prompt.into()), s)
        .unwrap()
        .collect_all()
        .unwrap()
        .text
}

#[test]
fn requests_route_by_model_and_models_load_and_unload() {
    let dir = test_dir("server_models");
    let a = write_tiny_gguf(&dir, "a.gguf", &TinySpec::default(), &mut rng(3));
    let spec_b = TinySpec {
        arch: "qwen2",
        ..TinySpec::default()
    };
    let b = write_tiny_gguf(&dir, "b.gguf", &spec_b, &mut rng(5));
    // The primary engine records a step trace: the server puts the other
    // models' loads and unloads in it.
    let primary = Engine::new(&EngineConfig {
        trace_steps: 256,
        ..cfg(a)
    })
    .unwrap();
    let want_a = solo(&primary, "one two three");
    let want_b = solo(&Engine::new(&cfg(b.clone())).unwrap(), "one two three");
    assert_ne!(want_a, want_b, "two different models");
    let reg = ModelRegistry::new(&kernels().ctx, cfg(b.clone()), None, None);
    reg.add("b", &b).unwrap();
    let reg = Arc::new(reg);
    let (rt, addr) = serve_in_background(
        &primary,
        ServerConfig {
            served_model_name: "a".into(),
            models: Some(reg.clone()),
            ..Default::default()
        },
    );
    let base = format!("http://{addr}");
    rt.block_on(async {
        let state = |v: &Value, id: &str| {
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["id"] == id)
                .map(|m| m["loaded"].as_bool().unwrap())
        };
        let (st, text) = get(&format!("{base}/v1/models")).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(st, 200);
        assert_eq!((state(&v, "a"), state(&v, "b")), (Some(true), Some(false)), "{v}");
        // Each model answers as itself; b loads for its first request.
        let url = format!("{base}/v1/completions");
        let body = |m: &str| json!({"model": m, "prompt": "one two three", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        for (m, want) in [("b", &want_b), ("a", &want_a), ("b", &want_b)] {
            let (st, v) = post_json(&url, &body(m)).await.unwrap();
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["model"], m);
            assert_eq!(&v["choices"][0]["text"], want.as_str(), "model {m}");
        }
        let (_, text) = get(&format!("{base}/v1/models")).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(state(&v, "b"), Some(true), "{v}");
        // Embeddings route too.
        let (st, v) = post_json(&format!("{base}/v1/embeddings"), &json!({"model": "b", "input": "hi"}))
            .await
            .unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["model"], "b");
        // One series a loaded model, one HELP a family.
        let (st, m) = get(&format!("{base}/metrics")).await.unwrap();
        assert_eq!(st, 200);
        for name in ["a", "b"] {
            assert!(
                m.contains(&format!("wllm:request_success_total{{model_name=\"{name}\"}}")),
                "{m}"
            );
        }
        assert_eq!(m.matches("# HELP wllm:request_success_total ").count(), 1, "{m}");
        assert!(m.contains("wllm:model_loaded{model_name=\"b\"} 1"), "{m}");
        // Unload, load, and what they refuse.
        let (st, v) = post_json(&format!("{base}/v1/models/b/unload"), &json!({})).await.unwrap();
        assert_eq!((st, &v["was_loaded"]), (200, &json!(true)), "{v}");
        assert!(!reg.is_loaded("b"));
        let (_, m2) = get(&format!("{base}/metrics")).await.unwrap();
        assert!(m2.contains("wllm:model_loaded{model_name=\"b\"} 0"), "{m2}");
        // The device's own count of its memory falls by at least b's plan.
        let gauge = |m: &str, name: &str| -> f64 {
            let line = m.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {m}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let (with_b, without_b) = (gauge(&m, "wllm:device_memory_bytes "), gauge(&m2, "wllm:device_memory_bytes "));
        assert!(without_b < with_b, "unloading b freed device memory: {with_b} -> {without_b}");
        let (st, v) = post_json(&format!("{base}/v1/models/b/load"), &json!({})).await.unwrap();
        assert_eq!((st, &v["loaded"]), (200, &json!(true)), "{v}");
        assert!(v["seconds"].as_f64().is_some(), "{v}");
        let (st, text) = get(&format!("{base}/engine/state")).await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(st, 200);
        assert_eq!(state(&json!({"data": v["models"]}), "b"), Some(true), "the engine page lists the models");
        let (st, v) = post_json(&format!("{base}/v1/models/a/unload"), &json!({})).await.unwrap();
        assert_eq!(st, 400, "the primary model stays: {v}");
        let (st, v) = post_json(&format!("{base}/v1/models/c/load"), &json!({})).await.unwrap();
        assert_eq!(st, 404, "{v}");
        let (st, v) = post_json(&url, &body("c")).await.unwrap();
        assert_eq!(st, 404, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("`a`") && msg.contains("`b`"), "the served models are named: {msg}");
        // Ollama's keep_alive: 0 unloads the model once its request is done.
        let mut once = body("b");
        once["keep_alive"] = json!(0);
        let (st, v) = post_json(&url, &once).await.unwrap();
        assert_eq!(st, 200, "{v}");
        let mut gone = false;
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if !reg.is_loaded("b") {
                gone = true;
                break;
            }
        }
        assert!(gone, "keep_alive 0: unloaded within 5 s of the request's end");
        let mut bad = body("b");
        bad["keep_alive"] = json!("soon");
        let (st, v) = post_json(&url, &bad).await.unwrap();
        assert_eq!(st, 400, "{v}");
    });
    // Each load a span, each unload an instant, with its reason (the idle
    // unload is told just after the registry marks it: wait for it).
    let model_events = || {
        let trace = primary.trace().unwrap();
        wllm::trace::tef::validate(&trace).unwrap();
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "model")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["args"]["detail"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<(String, String)>>()
    };
    let mut told = model_events();
    for _ in 0..50 {
        if told.len() >= 4 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        told = model_events();
    }
    let names: Vec<&str> = told.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(names, ["load b", "unload b", "load b", "unload b"], "{told:?}");
    assert_eq!(
        (told[1].1.as_str(), told[3].1.as_str()),
        ("request", "idle"),
        "{told:?}"
    );
}
