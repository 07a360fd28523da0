//! The HTTP server over real TCP on 127.0.0.1, driven by wllm's own client:
//! every endpoint, streaming and not, SSE framing, error shapes, disconnects,
//! and concurrent streams that each match the engine's solo output.

mod common;

use std::time::Duration;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use serde_json::{Value, json};
use wllm::client::{get, post_json, post_raw, post_stream};
use wllm::server::ServerConfig;
use wllm::{Engine, EngineConfig, Prompt, SamplingParams};

struct Server {
    base: String,
    engine: Engine,
    rt: tokio::runtime::Runtime,
}

fn start(name: &str, max_pending: usize) -> Server {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(3));
    let cfg = EngineConfig {
        model,
        kv_cache_memory: Some(4096 * 512),
        max_model_len: Some(1024),
        ..Default::default()
    };
    let engine = Engine::new(&cfg).unwrap();
    let cfg = ServerConfig {
        served_model_name: "tiny".into(),
        max_pending_requests: max_pending,
        ..Default::default()
    };
    let (rt, addr) = serve_in_background(&engine, cfg);
    Server {
        base: format!("http://{addr}"),
        engine,
        rt,
    }
}

fn solo(engine: &Engine, prompt: &str, max_tokens: usize) -> (String, Vec<u32>) {
    let s = SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let r = engine
        .generate(Prompt::Text(prompt.into()), s)
        .unwrap()
        .collect_all()
        .unwrap();
    (r.text, r.token_ids)
}

/// Reads an SSE response to the end; returns the parsed chunks and whether `[DONE]` closed it.
async fn read_sse(url: &str, body: &Value) -> (Vec<Value>, bool) {
    let mut r = post_stream(url, body).await.unwrap();
    assert_eq!(r.status, 200);
    let mut chunks = Vec::new();
    let mut done = false;
    while let Some(ev) = r.next_event().await.unwrap() {
        assert!(!done, "data after [DONE]");
        if ev == "[DONE]" {
            done = true;
        } else {
            chunks.push(serde_json::from_str(&ev).unwrap_or_else(|e| panic!("chunk {ev:?} is not JSON: {e}")));
        }
    }
    (chunks, done)
}

#[test]
fn endpoints_answer_in_openai_shapes() {
    let s = start("server_endpoints", 64);
    let b = s.base.clone();
    let (want_text, want_ids) = solo(&s.engine, "hello there", 10);
    let n_prompt = s.engine.tokenize(&Prompt::Text("hello there".into())).unwrap().len();
    s.rt.block_on(async {
        assert_eq!(get(&format!("{b}/health")).await.unwrap().0, 200);
        let (st, models) = get(&format!("{b}/v1/models")).await.unwrap();
        assert_eq!(st, 200);
        let models: Value = serde_json::from_str(&models).unwrap();
        assert_eq!(models["data"][0]["id"], "tiny");
        assert_eq!(models["object"], "list");

        assert_eq!(get(&format!("{b}/v1/models/tiny")).await.unwrap().0, 200);
        assert_eq!(get(&format!("{b}/v1/models/other")).await.unwrap().0, 404);
        // Explicit nulls are accepted as "unset", as OpenAI clients send them.
        let body = json!({"model": "tiny", "prompt": "hello there", "max_tokens": 10, "temperature": 0, "ignore_eos": true,
                          "stream": null, "stop": null, "n": null, "logprobs": null, "top_p": null, "seed": null});
        let (st, v) = post_json(&format!("{b}/v1/completions"), &body).await.unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], want_text.as_str());
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], want_ids.len());
        assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
        assert_eq!(v["usage"]["total_tokens"], n_prompt + want_ids.len());

        // Streamed completion: the same text, chunk by chunk.
        let (chunks, done) = read_sse(&format!("{b}/v1/completions"), &json!({"prompt": "hello there", "max_tokens": 10, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})).await;
        assert!(done);
        let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| c["text"].as_str().unwrap().to_string()).collect();
        assert_eq!(text, want_text);
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(usage["completion_tokens"], want_ids.len());

        // Chat, plain and streamed, with n = 2 and logprobs.
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let body = json!({"messages": msgs, "max_completion_tokens": 6, "temperature": 0, "n": 2, "logprobs": true, "top_logprobs": 3, "ignore_eos": true});
        let (st, v) = post_json(&format!("{b}/v1/chat/completions"), &body).await.unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"].as_array().unwrap().len(), 2);
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], v["choices"][1]["message"]["content"], "greedy choices agree");
        let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(lp.len(), 6);
        assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 3);
        assert!(lp[0]["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(v["usage"]["completion_tokens"], 12);

        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["n"] = json!(1);
        let (chunks, done) = read_sse(&format!("{b}/v1/chat/completions"), &sbody).await;
        assert!(done);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");

        let (st, metrics) = get(&format!("{b}/metrics")).await.unwrap();
        assert_eq!(st, 200);
        for name in ["wllm:time_to_first_token_seconds_bucket", "wllm:inter_token_latency_seconds_count", "wllm:e2e_request_latency_seconds_sum", "wllm:num_requests_running", "wllm:kv_cache_usage_perc", "wllm:prompt_tokens_total", "wllm:generation_tokens_total", "wllm:prefix_cache_hits_total", "wllm:num_preemptions_total", "wllm:gpu_memory_reserved_bytes", "wllm:gpu_memory_allocated_peak_bytes"] {
            assert!(metrics.contains(name), "/metrics lacks {name}");
        }
        // The KV cache's dtype and bytes (the default: f16, 2 bytes an element).
        assert!(metrics.contains("cache_dtype=\"f16\""), "{metrics}");
        let gauge = |name: &str| -> f64 {
            let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("/metrics lacks {name}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        // The server compiled its pipelines (in the warm-up), and says so.
        assert!(gauge("wllm:pipelines_compiled_total{") > 0.0, "{metrics}");
        assert!(gauge("wllm:pipeline_compile_seconds_total{") > 0.0, "{metrics}");
        let (st, engine) = get(&format!("{b}/engine/state")).await.unwrap();
        assert_eq!(st, 200);
        let e: Value = serde_json::from_str(&engine).unwrap();
        let kv = &e["kv"];
        assert_eq!(kv["dtype"], "f16", "{e}");
        let per_token = gauge("wllm:kv_cache_bytes_per_token{");
        assert_eq!(kv["bytes_per_token"].as_f64(), Some(per_token));
        // The tiny model: 2 layers x 2 KV heads x head_dim 16, K and V, 2 bytes each.
        assert_eq!(per_token, (2 * 2 * 2 * 16 * 2) as f64);
        let pool = gauge("wllm:kv_cache_bytes{");
        assert_eq!(kv["pool_bytes"].as_f64(), Some(pool));
        let blocks = kv["num_blocks"].as_f64().unwrap() * kv["block_size"].as_f64().unwrap();
        assert_eq!(pool, blocks * per_token);
        // The memory plan and what was allocated: weights and step buffers add
        // up to the idle allocation (no block in use at idle).
        let mem = &e["memory"];
        let (weights, steps) = (gauge("wllm:model_weights_bytes{"), gauge("wllm:step_buffer_bytes{"));
        assert!(weights > 0.0 && steps > 0.0, "{mem}");
        assert_eq!(mem["weights"].as_f64(), Some(weights));
        assert_eq!(mem["step_buffers"].as_f64(), Some(steps));
        assert_eq!(mem["kv"].as_f64(), Some(pool));
        assert!(mem["describe"].as_str().is_some_and(|d| d.starts_with("memory plan: weights")), "{mem}");
        // (The tiny model's 32-row matrices fill a 192-row texture group
        // each on CPU adapters: its planned weights are not its allocation.
        // engine_model_tests checks the plan on the default model.)
        assert_eq!(mem["plan"]["sizing"], "given", "{mem}");
        assert_eq!(mem["plan"]["kv"].as_f64(), Some(pool), "{mem}");
    });
}

#[test]
fn errors_have_the_openai_shape_and_status() {
    let s = start("server_errors", 64);
    let b = s.base.clone();
    s.rt.block_on(async {
        let url = format!("{b}/v1/completions");
        let check = |st: u16, v: &Value, want: u16| {
            assert_eq!(st, want, "{v}");
            assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
            assert!(v["error"]["type"].is_string(), "{v}");
        };
        let (st, text) = post_raw(&url, "{\"prompt\": ").await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        check(st, &v, 400);
        assert!(v["error"]["message"].as_str().unwrap().contains("malformed"));
        let (st, v) = post_json(&url, &json!({"prompt": "x", "model": "other"}))
            .await
            .unwrap();
        check(st, &v, 404);
        let (st, v) = post_json(&url, &json!({"prompt": "x", "temperature": -1}))
            .await
            .unwrap();
        check(st, &v, 400);
        let (st, v) = post_json(&url, &json!({"prompt": "x", "n": 0})).await.unwrap();
        check(st, &v, 400);
        // A request's own speculation: a draft model this server has not
        // loaded, and a field the shape does not have, are refused; prompt
        // lookup for the request alone is served.
        let spec = |c: Value| json!({"prompt": "a b a b a b", "max_tokens": 4, "speculative_config": c});
        let (st, v) = post_json(&url, &spec(json!({"method": "draft_model"}))).await.unwrap();
        check(st, &v, 400);
        assert!(
            v["error"]["message"].as_str().unwrap().contains("no draft model"),
            "{v}"
        );
        let (st, v) = post_json(&url, &spec(json!({"model": "draft.gguf"}))).await.unwrap();
        check(st, &v, 400);
        let (st, v) = post_json(&url, &spec(json!({"num_speculative_tokens": 3})))
            .await
            .unwrap();
        assert_eq!(st, 200, "{v}");
        let (st, v) = post_json(&url, &json!({"max_tokens": 3})).await.unwrap();
        check(st, &v, 400);
        let (st, v) = post_json(&url, &json!({"prompt": "a".repeat(1100), "max_tokens": 3}))
            .await
            .unwrap();
        check(st, &v, 400);
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("1100") && m.contains("1024"), "{m}");
        let (st, v) = post_json(&format!("{b}/v1/chat/completions"), &json!({"messages": []}))
            .await
            .unwrap();
        check(st, &v, 400);
        let (st, _) = get(&format!("{b}/v1/nothing")).await.unwrap();
        assert_eq!(st, 404);
    });
    // A server at its limit of requests in flight answers 503.
    let s2 = start("server_overload", 0);
    let b2 = s2.base.clone();
    s2.rt.block_on(async {
        let (st, v) = post_json(&format!("{b2}/v1/completions"), &json!({"prompt": "x"}))
            .await
            .unwrap();
        assert_eq!(st, 503, "{v}");
        assert_eq!(v["error"]["type"], "server_overloaded");
    });
}

#[test]
fn a_client_that_disconnects_frees_its_blocks() {
    let s = start("server_disconnect", 64);
    let b = s.base.clone();
    s.rt.block_on(async {
        let body =
            json!({"prompt": "a long story", "max_tokens": 1000, "temperature": 0, "ignore_eos": true, "stream": true});
        let mut r = post_stream(&format!("{b}/v1/completions"), &body).await.unwrap();
        assert!(r.next_event().await.unwrap().is_some());
        drop(r);
    });
    let t0 = std::time::Instant::now();
    loop {
        let st = s.engine.block_stats().unwrap();
        if st.num_live_sequences == 0 {
            st.consistent.unwrap();
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the aborted request still holds blocks: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // It ended because it was aborted, not because it ran out: far fewer than
    // its 1000 tokens were generated, and it did not finish as a success.
    let m = s.engine.metrics().unwrap();
    assert!(
        m.generation_tokens_total < 500,
        "{} tokens generated: the request ran on after its client left",
        m.generation_tokens_total
    );
    assert_eq!(
        m.request_success_total, 0,
        "the aborted request was counted as finished"
    );
    s.engine.reset_prefix_cache().unwrap();
    let st = s.engine.block_stats().unwrap();
    assert_eq!(st.num_free, st.num_blocks);
}

#[test]
fn concurrent_streams_each_match_the_solo_output() {
    let s = start("server_concurrent", 64);
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("prompt number {i} {}", "x".repeat(i * 37)))
        .collect();
    let want: Vec<String> = prompts.iter().map(|p| solo(&s.engine, p, 12).0).collect();
    let b = s.base.clone();
    let got: Vec<String> = s.rt.block_on(async {
        let tasks: Vec<_> = prompts
            .iter()
            .map(|p| {
                let url = format!("{b}/v1/completions");
                let body = json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true});
                tokio::spawn(async move {
                    let (chunks, done) = read_sse(&url, &body).await;
                    assert!(done);
                    chunks
                        .iter()
                        .filter_map(|c| c["choices"].get(0))
                        .map(|c| c["text"].as_str().unwrap().to_string())
                        .collect::<String>()
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert_eq!(got, want);
}

/// `vllm_metric_names` (`--vllm-metric-names`): /metrics also carries every
/// series under vLLM's names with the same values (what vllm-router and
/// llm-d scrape), and the older `vllm:gpu_cache_usage_perc`; without it, no
/// `vllm:` series.
#[test]
fn metrics_under_vllms_names_on_request() {
    let s = start("server_vllm_names", 64);
    let cfg = ServerConfig {
        served_model_name: "tiny".into(),
        vllm_metric_names: true,
        ..Default::default()
    };
    let (rt2, addr) = serve_in_background(&s.engine, cfg);
    let b = format!("http://{addr}");
    rt2.block_on(async {
        let body = json!({"model": "tiny", "prompt": "hello", "max_tokens": 3});
        let (st, done) = post_json(&format!("{b}/v1/completions"), &body).await.unwrap();
        assert_eq!(st, 200);
        let (_, m) = get(&format!("{b}/metrics")).await.unwrap();
        let value = |name: &str| -> String {
            let line = m
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("/metrics lacks {name}"));
            line.rsplit(' ').next().unwrap().to_string()
        };
        for name in [
            "num_requests_waiting",
            "num_requests_running",
            "kv_cache_usage_perc",
            "prefix_cache_queries_total",
            "prefix_cache_hits_total",
            "generation_tokens_total",
        ] {
            assert_eq!(
                value(&format!("vllm:{name}{{")),
                value(&format!("wllm:{name}{{")),
                "{name}"
            );
        }
        assert_eq!(value("vllm:gpu_cache_usage_perc{"), value("wllm:kv_cache_usage_perc{"));
        // Sampled: an end-of-sequence token may stop it before max_tokens.
        let generated = done["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..=3).contains(&generated), "{done}");
        assert_eq!(value("vllm:generation_tokens_total{"), generated.to_string());
        let (_, plain) = get(&format!("{}/metrics", s.base)).await.unwrap();
        assert!(!plain.contains("vllm:"), "vllm: names without the flag");
    });
}
