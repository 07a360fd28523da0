//! Fuzzing every parser of untrusted bytes on stable Rust: proptest mutations
//! (byte edits, splatted huge lengths, truncation, duplication) of real inputs
//! — a GGUF, a safetensors file, config.json, tokenizer.json /
//! tokenizer_config.json, request bodies — fed to wllm's parsers. Each must
//! return (Ok or a clear error) without a panic, without reading out of
//! bounds (a panic in Rust), and without allocating more than the input
//! justifies (a counting allocator checks the peak). `WLLM_FUZZ_CASES` sets
//! the cases per target (CI's default is small and bounded in time); the
//! counts tried are printed.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are atomics touched without allocating.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed through.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One fuzz target at a time, so the allocation peak is its own.
static ONE: Mutex<()> = Mutex::new(());

fn cases() -> u32 {
    std::env::var("WLLM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Runs `f` and fails if it allocated more than `limit` bytes at its peak.
fn within<T>(limit: usize, what: &str, f: impl FnOnce() -> T) -> T {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let used = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(used <= limit, "{what}: allocated {used} bytes at peak, over {limit}");
    out
}

/// A mutation of a valid input: byte edits, a huge length written somewhere,
/// truncation, or a duplicated span.
#[derive(Clone, Debug)]
enum Edit {
    Byte(usize, u8),
    Huge(usize, u64),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let e = prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Edit::Byte(p, b)),
        2 => (any::<usize>(), prop_oneof![Just(u64::MAX), Just(1u64 << 60), Just(1u64 << 32), any::<u64>()])
            .prop_map(|(p, v)| Edit::Huge(p, v)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        1 => (any::<usize>(), 0usize..64).prop_map(|(p, n)| Edit::Duplicate(p, n)),
    ];
    proptest::collection::vec(e, 1..6)
}

/// Edits applied within `head` bytes (where the structure a parser reads is).
fn apply(base: &[u8], head: usize, es: &[Edit]) -> Vec<u8> {
    let mut b = base.to_vec();
    for e in es {
        let n = b.len().min(head).max(1);
        match *e {
            Edit::Byte(p, v) => {
                if !b.is_empty() {
                    let i = p % n.min(b.len());
                    b[i] = v;
                }
            }
            Edit::Huge(p, v) => {
                let i = p % n;
                for (k, byte) in v.to_le_bytes().into_iter().enumerate() {
                    if let Some(x) = b.get_mut(i + k) {
                        *x = byte;
                    }
                }
            }
            Edit::Truncate(p) => b.truncate(p % (b.len() + 1)),
            Edit::Duplicate(p, len) => {
                if !b.is_empty() {
                    let i = p % n.min(b.len());
                    let span: Vec<u8> = b[i..(i + len).min(b.len())].to_vec();
                    b.splice(i..i, span);
                }
            }
        }
    }
    b
}

fn run<S: Strategy>(name: &str, strategy: S, check: impl FnMut(&S::Value)) {
    let check = std::cell::RefCell::new(check);
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let tried = std::cell::Cell::new(0u32);
    runner
        .run(&strategy, |v| {
            tried.set(tried.get() + 1);
            (check.borrow_mut())(&v);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("fuzz {name}: {} inputs, 0 crashes", tried.get());
}

#[test]
fn gguf_parser_survives_mutations() {
    let dir = test_dir("fuzz_gguf");
    let base = std::fs::read(write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(1))).unwrap();
    // The metadata and directory are what the parser walks; edits land there.
    let head = base.len().min(16 << 10);
    run("gguf", edits(), |es| {
        let bytes = apply(&base, head, es);
        let limit = 64 * bytes.len() + (32 << 20);
        within(limit, "gguf", || {
            let Ok(g) = wllm::model::gguf::GgufFile::from_bytes(&bytes) else {
                return;
            };
            let _ = wllm::model::ModelConfig::from_gguf(&g);
            if let Ok(t) = wllm::tokenizer::Tokenizer::from_gguf(&g) {
                let _ = t.encode("Hello, wörld 123 <|im_start|>");
                let _ = t.decode(&[1, 2, 300, 70000]);
            }
            let files = wllm::model::ModelFiles::Gguf {
                path: "fuzz.gguf".into(),
                file: g,
                requant: None,
            };
            for name in [
                "token_embd.weight",
                "blk.0.attn_q.weight",
                "blk.1.ffn_down.weight",
                "output_norm.weight",
            ] {
                if let Ok(t) = files.tensor(name) {
                    let _ = wllm::quant::dequantize(t.format, &t.bytes, t.rows, t.cols);
                }
            }
        });
    });
}

#[test]
fn gguf_header_claiming_2_pow_60_of_everything_is_refused_without_allocating() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    for (tensors, kvs) in [(1u64 << 60, 0u64), (0, 1 << 60), (u64::MAX, u64::MAX)] {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        // One string key claiming an array of 2^60 u8 values.
        b.extend(4u64.to_le_bytes());
        b.extend(b"k.ey");
        b.extend(9u32.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend((1u64 << 60).to_le_bytes());
        let e = within(1 << 20, "2^60 header", || {
            wllm::model::gguf::GgufFile::from_bytes(&b).err()
        });
        assert!(e.is_some(), "a 2^60 header was accepted");
    }
}

#[test]
fn safetensors_header_parser_survives_mutations() {
    let dir = test_dir("fuzz_st");
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![
        ("model.embed_tokens.weight".into(), vec![4, 8], vec![0u8; 4 * 8 * 2]),
        ("model.norm.weight".into(), vec![8], vec![0u8; 8 * 4]),
    ];
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            let dt = if s.len() == 2 {
                safetensors::Dtype::F16
            } else {
                safetensors::Dtype::F32
            };
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let base = safetensors::serialize(views, None).unwrap();
    let head = base.len();
    let mut i = 0usize;
    run("safetensors", edits(), |es| {
        let bytes = apply(&base, head, es);
        let d = dir.join(format!("c{}", i % 4));
        i += 1;
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("model.safetensors"), &bytes).unwrap();
        within(64 * bytes.len() + (16 << 20), "safetensors", || {
            if let Ok(st) = wllm::model::safetensors::SafetensorsDir::open(&d) {
                for t in st.tensors.values() {
                    let rows: usize = t.shape.iter().rev().skip(1).product();
                    let cols = t.shape.last().copied().unwrap_or(1);
                    let _ = wllm::quant::dequantize(t.format, st.bytes(t), rows, cols);
                }
            }
        });
    });
}

const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
 "vocab_size": 260, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 1024,
 "tie_word_embeddings": true, "head_dim": 16,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
   "original_max_position_embeddings": 8192}}"#;

#[test]
fn config_json_parser_survives_mutations() {
    let base = CONFIG.as_bytes().to_vec();
    run("config.json", edits(), |es| {
        let bytes = apply(&base, base.len(), es);
        let text = String::from_utf8_lossy(&bytes);
        within(64 * bytes.len() + (4 << 20), "config.json", || {
            if let Ok(c) = wllm::model::ModelConfig::from_hf_json(&text) {
                let _ = c.kv_bytes_per_token(wllm::config::KvDtype::F32);
            }
        });
    });
}

#[test]
fn tokenizer_files_survive_mutations() {
    let dir = test_dir("fuzz_tok");
    let g = write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(2));
    let hf = dir.join("hf");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gguf-to-hf"))
        .arg(&g)
        .arg(&hf)
        .output()
        .unwrap();
    assert!(st.status.success());
    let tok = std::fs::read(hf.join("tokenizer.json")).unwrap();
    let tc = std::fs::read(hf.join("tokenizer_config.json")).unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(hf.join(f), work.join(f)).unwrap();
    }
    run("tokenizer files", (edits(), any::<bool>()), |(es, which)| {
        let (a, b) = if *which {
            (apply(&tok, tok.len(), es), tc.clone())
        } else {
            (tok.clone(), apply(&tc, tc.len(), es))
        };
        std::fs::write(work.join("tokenizer.json"), &a).unwrap();
        std::fs::write(work.join("tokenizer_config.json"), &b).unwrap();
        // (40 MiB of slack: a duplicated span in tokenizer.json took the tokenizers crate to 33.4 MiB.)
        within(256 * (a.len() + b.len()) + (40 << 20), "tokenizer", || {
            if let Ok(t) = wllm::tokenizer::Tokenizer::from_hf_dir(&work) {
                let _ = t.encode("Hello, wörld 123 <|im_start|>");
                let _ = t.apply_chat_template(&[wllm::ChatMessage::new("user", "hi")]);
            }
        });
    });
}

/// A tiny model's engine (48 tokens of context), the router `wllm serve`
/// builds over it, and a runtime to drive it without sockets.
fn tiny_server(name: &str) -> (wllm::Engine, axum::Router, tokio::runtime::Runtime) {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(4));
    let engine = wllm::Engine::new(&wllm::EngineConfig {
        model,
        kv_cache_memory: Some(1 << 20),
        max_model_len: Some(48),
        ..Default::default()
    })
    .unwrap();
    let app = wllm::server::router(engine.clone(), wllm::server::ServerConfig::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    (engine, app, rt)
}

#[test]
fn request_bodies_survive_mutations() {
    use tower::ServiceExt;
    let (engine, app, rt) = tiny_server("fuzz_req");
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        (
            "/v1/completions",
            br#"{"prompt": ["ab", "cd"], "max_tokens": 3, "n": 2, "stop": ["x"], "temperature": 0.5, "top_p": 0.9, "logprobs": 2, "seed": 7}"#.to_vec(),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 3, "stream": true, "logprobs": true, "top_logprobs": 2}"#.to_vec(),
        ),
    ];
    run("request JSON", (edits(), any::<bool>()), |(es, which)| {
        let (path, base) = &bodies[usize::from(*which)];
        let body = apply(base, base.len(), es);
        let req = axum::http::Request::post(*path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.clone()))
            .unwrap();
        let (status, text) = rt.block_on(async {
            let r = app.clone().oneshot(req).await.unwrap();
            let st = r.status();
            let b = axum::body::to_bytes(r.into_body(), 1 << 24).await.unwrap();
            (st, String::from_utf8_lossy(&b).to_string())
        });
        assert!(
            status.as_u16() < 500,
            "{status} for {:?}: {text}",
            String::from_utf8_lossy(&body)
        );
        if status.as_u16() >= 400 {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v["error"]["message"].is_string(), "{text}");
        }
    });
    let bs = engine.block_stats().unwrap();
    assert_eq!(bs.num_free, bs.num_blocks, "blocks leaked after the fuzzed requests");
}

/// Row 2 of issue 57's review: a request's `n` sequences shared nothing, so
/// its stop strings were copied per sequence (and again per stop checker);
/// now they are held once, whatever `n` and the prompt count.
#[test]
fn a_requests_sequences_share_one_copy_of_its_parameters() {
    let dir = test_dir("fuzz_shared_params");
    let model = write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(4));
    let engine = wllm::Engine::new(&wllm::EngineConfig {
        model,
        kv_cache_memory: Some(1 << 20),
        max_model_len: Some(48),
        max_num_seqs: 256,
        ..Default::default()
    })
    .unwrap();
    let stops: Vec<String> = (0..wllm::sampling::MAX_STOP_STRINGS)
        .map(|i| format!("{i:04}{}", "s".repeat(wllm::sampling::MAX_STOP_STRING_BYTES - 4)))
        .collect();
    let params = wllm::SamplingParams {
        stop: stops,
        max_tokens: Some(1),
        ..Default::default()
    };
    let stop_bytes = wllm::sampling::MAX_STOP_STRINGS * wllm::sampling::MAX_STOP_STRING_BYTES;
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let prompts: Vec<wllm::Prompt> = (0..4).map(|_| wllm::Prompt::Tokens(vec![1, 2, 3])).collect();
    // 256 sequences: 16 MiB of stop strings if each held its own copy (32
    // with the checkers'); the slack is the sequences themselves and the
    // engine thread's first step, which may run meanwhile.
    let streams = within(4 * stop_bytes + (8 << 20), "n = 64 x 4 prompts", || {
        engine.generate_n(prompts, params, 64).unwrap()
    });
    assert_eq!(streams.len(), 256);
    for s in streams {
        s.collect_all().unwrap();
    }
    let bs = engine.block_stats().unwrap();
    assert_eq!(bs.num_free, bs.num_blocks);
}

/// Row 8: a GGUF with a huge `u8` metadata array once took 32 bytes a byte
/// (a boxed value each); numeric arrays are now kept as stored, and the
/// whole metadata is held to a budget.
#[test]
fn a_gguf_numeric_array_costs_its_bytes() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let n: usize = 16 << 20;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(6u64.to_le_bytes());
    b.extend(b"k.blob");
    b.extend(9u32.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    b.extend((0..n).map(|i| (i % 251) as u8));
    // (from_bytes copies the file into an anonymous map, not the heap.)
    let g = within(2 * n + (1 << 20), "16 MiB u8 array", || {
        wllm::model::gguf::GgufFile::from_bytes(&b).unwrap()
    });
    let v = g.get("k.blob").unwrap();
    assert_eq!(v.array_len(), Some(n));
    let wllm::model::gguf::Value::Packed(p) = v else {
        panic!("not packed")
    };
    assert_eq!(p.get(1000), Some(wllm::model::gguf::Value::U64(1000 % 251)));
    assert_eq!(p.get(n), None);
    // An array of 2^27 strings of no bytes (a length of 8 bytes each in the
    // file, 32 in memory) passes the metadata budget: refused, unallocated.
    let strings: u64 = 1 << 27;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(5u64.to_le_bytes());
    b.extend(b"k.str");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(strings.to_le_bytes());
    b.resize(b.len() + 8 * strings as usize, 0);
    let e = within(64 << 20, "2^27 empty strings", || {
        wllm::model::gguf::GgufFile::from_bytes(&b).err()
    });
    assert!(e.is_some_and(|e| e.to_string().contains("metadata")));
}

/// The hostile-input harness: request bodies whose every field is drawn
/// from its extremes (numbers past their ranges, lists at and past their
/// bounds, wrong types, huge strings), sent through the router. Each must
/// end (within a time only a hang passes) in a response under 500 (an
/// OpenAI error object where it is refused) within bounded memory; after
/// them all a small request is served and no block is held.
#[test]
fn hostile_request_bodies_end_bounded() {
    use serde_json::{Value, json};
    use tower::ServiceExt;
    let (engine, app, rt) = tiny_server("fuzz_hostile");
    let big = || json!(u64::MAX);
    let num = prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(1e30)),
        Just(big()),
        Just(json!(65)),
        Just(json!("7")),
        Just(Value::Null)
    ];
    let text = prop_oneof![
        Just(json!("he")),
        Just(json!("")),
        Just(json!("he ".repeat(20000))),
        (1usize..70, 0usize..1100).prop_map(|(n, len)| json!(vec!["s".repeat(len); n])),
    ];
    let ids = prop_oneof![
        Just(json!([1, 2, 3])),
        Just(json!([u32::MAX])),
        (0usize..1100).prop_map(|n| json!((0..n as u32).collect::<Vec<_>>())),
    ];
    let spec = (num.clone(), num.clone(), num.clone(), prop_oneof![Just("ngram"), Just("draft_model"), Just("x")])
        .prop_map(|(k, max, min, m)| {
            json!({"method": m, "num_speculative_tokens": k, "prompt_lookup_max": max, "prompt_lookup_min": min})
        });
    let keep = prop_oneof![
        Just(json!(1e20)),
        Just(json!(-1)),
        Just(json!("5m")),
        Just(json!("inf")),
        Just(json!("1h30m")),
        Just(json!(0))
    ];
    let schema = (0usize..4000).prop_map(|n| {
        let props: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("p{i}"), json!({"type": "integer"}))).collect();
        json!({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": props}}})
    });
    let fields = (
        (num.clone(), num.clone(), num.clone(), num.clone(), num.clone()),
        (text.clone(), ids.clone(), text, ids),
        (spec, keep, schema),
        proptest::collection::vec(any::<bool>(), 12),
        any::<bool>(),
    );
    let cases = cases().min(40);
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let tried = std::cell::Cell::new(0u32);
    runner
        .run(
            &fields,
            |((n, max_tokens, temp, top_k, logprobs), (prompt, tokens, stop, stop_ids), (spec, keep, rf), on, chat)| {
                tried.set(tried.get() + 1);
                let mut body = json!({});
                let mut set = |i: usize, k: &str, v: &Value| {
                    if on[i] {
                        body[k] = v.clone();
                    }
                };
                set(0, "n", &n);
                set(1, "max_tokens", &max_tokens);
                set(2, "temperature", &temp);
                set(3, "top_k", &top_k);
                set(4, "logprobs", &logprobs);
                set(5, "stop", &stop);
                set(6, "stop_token_ids", &stop_ids);
                set(7, "speculative_config", &spec);
                set(8, "keep_alive", &keep);
                set(9, "response_format", &rf);
                set(10, "seed", &big());
                let path = if chat {
                    let content = if on[11] { prompt.clone() } else { json!("hi") };
                    body["messages"] = json!([{"role": "user", "content": content}]);
                    "/v1/chat/completions"
                } else {
                    body["prompt"] = if on[11] { prompt.clone() } else { tokens.clone() };
                    "/v1/completions"
                };
                let text = body.to_string();
                let req = axum::http::Request::post(path)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(text.clone()))
                    .unwrap();
                let (status, out) = within(256 << 20, "a hostile request", || {
                    rt.block_on(async {
                        let r = tokio::time::timeout(std::time::Duration::from_secs(120), app.clone().oneshot(req))
                            .await
                            .unwrap_or_else(|_| panic!("no answer within 120 s: {}", &text[..text.len().min(400)]))
                            .unwrap();
                        let st = r.status();
                        let b = axum::body::to_bytes(r.into_body(), 1 << 26).await.unwrap();
                        (st, String::from_utf8_lossy(&b).to_string())
                    })
                });
                let shown = &text[..text.len().min(400)];
                assert!(status.as_u16() < 500, "{status} for {shown}: {out}");
                if status.as_u16() >= 400 {
                    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
                    assert!(v["error"]["message"].is_string(), "{out}");
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("hostile bodies: {e}"));
    eprintln!("fuzz hostile bodies: {} requests, all ended", tried.get());
    let ok = axum::http::Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"prompt": "he", "max_tokens": 2}"#))
        .unwrap();
    let st = rt.block_on(async { app.clone().oneshot(ok).await.unwrap().status() });
    assert_eq!(st, 200);
    let bs = engine.block_stats().unwrap();
    assert_eq!(bs.num_free, bs.num_blocks, "blocks leaked after the hostile requests");
}

/// Chat templates from a file are code: mutated templates (and ones that
/// loop or write without end) must render, fail, or run out of their fuel
/// and output cap, within bounded memory.
#[test]
fn chat_templates_survive_mutations() {
    let dir = test_dir("fuzz_template");
    let g =
        wllm::model::gguf::GgufFile::open(&write_tiny_gguf(&dir, "t.gguf", &TinySpec::default(), &mut rng(3))).unwrap();
    let mut tok = wllm::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let templates: Vec<&[u8]> = vec![
        b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        b"{{ bos_token }}{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content %}{{ m.role | upper }}: {{ m.content | trim }}{% endfor %}{{ ns.s * 3 }}",
        b"{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
        b"{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
        b"{% for m in messages %}{{ (m.content ~ '|') * 1000 }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}",
    ];
    let msgs = [
        wllm::ChatMessage::new("system", "be brief"),
        wllm::ChatMessage::new("user", "hi there"),
    ];
    run("chat templates", (edits(), 0usize..5), |(es, which)| {
        let base = templates[*which];
        let t = String::from_utf8_lossy(&apply(base, base.len(), es)).into_owned();
        tok.chat_template = Some(t);
        within(64 << 20, "chat template", || {
            let _ = tok.apply_chat_template_capped(&msgs, None, 1 << 20);
        });
    });
}
