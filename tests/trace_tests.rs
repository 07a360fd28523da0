//! Step traces end to end: `wllm bench serve --trace` at concurrency 16 writes
//! valid Trace Event Format whose events add up (every request arrives,
//! prefills its whole prompt in contiguous chunks, decodes each output token
//! but the first, and finishes; prefill chunks run beside decodes); a small
//! pool's preemptions show in the trace and its report while the outputs stay
//! those of each request alone; `wllm trace` refuses truncated and foreign files.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;
use wllm::trace::{report, tef};
use wllm::{Engine, EngineConfig, KvDtype, Prompt, SamplingParams};

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/trace-tests");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wllm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wllm"))
        .args(args)
        .env(
            "XDG_RUNTIME_DIR",
            std::env::var("XDG_RUNTIME_DIR").unwrap_or_else(|_| "/tmp".into()),
        )
        .output()
        .expect("run wllm")
}

/// Per request: (prompt tokens, prefill chunks (start, len), decodes, finish reason).
type Story = (u64, Vec<(u64, u64)>, usize, String);

fn stories(v: &Value) -> BTreeMap<u64, Story> {
    let mut out: BTreeMap<u64, Story> = BTreeMap::new();
    for e in v["traceEvents"].as_array().unwrap() {
        let Some(tid) = e["tid"].as_u64().filter(|&t| t > 0 && e["cat"] == "request") else {
            continue;
        };
        let s = out.entry(tid - 1).or_default();
        let a = &e["args"];
        match e["name"].as_str().unwrap() {
            "arrived" => s.0 = a["prompt_tokens"].as_u64().unwrap(),
            "prefill" => s.1.push((a["start"].as_u64().unwrap(), a["tokens"].as_u64().unwrap())),
            "decode" => s.2 += 1,
            "finished" => s.3 = a["reason"].as_str().unwrap().into(),
            _ => {}
        }
    }
    out
}

#[test]
fn bench_serve_trace_at_concurrency_16_is_valid_and_adds_up() {
    let path = out_dir().join("bench-serve-16.json");
    let o = wllm(&[
        "bench",
        "serve",
        "--concurrency",
        "16",
        "--num-prompts",
        "16",
        "--input-len",
        "128",
        "--output-len",
        "12",
        "--trace",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    tef::validate(&v).unwrap();
    let s = stories(&v);
    assert_eq!(s.len(), 16, "{:?}", s.keys());
    for (id, (prompt, chunks, decodes, finish)) in &s {
        assert!(*prompt > 100, "request {id}: prompt {prompt}");
        // Chunks are contiguous from the cached prefix to the prompt's end.
        let mut at = chunks[0].0;
        for &(start, len) in chunks {
            assert_eq!(start, at, "request {id}: chunks {chunks:?}");
            at += len;
        }
        assert_eq!(at, *prompt, "request {id}: chunks {chunks:?}");
        assert_eq!(finish, "length", "request {id}");
        assert_eq!(
            *decodes, 11,
            "request {id}: 12 output tokens, the first from the prefill"
        );
    }
    let steps: Vec<&Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "step")
        .collect();
    let mixed = steps
        .iter()
        .filter(|e| e["args"]["prefill_tokens"].as_u64() > Some(0) && e["args"]["decode_tokens"].as_u64() > Some(0))
        .count();
    assert!(mixed > 0, "no step ran a prefill chunk beside decodes");
    assert!(steps.iter().all(|e| e["args"]["batch"].as_u64() <= Some(16)));
    // The report lays out the same steps, with prefill and decode in one column.
    let data = report::load(&path).unwrap();
    let n = data["steps"].as_array().unwrap().len();
    assert_eq!(n, steps.len());
    let cells: Vec<Vec<u8>> = data["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cells"].as_str().unwrap().as_bytes().to_vec())
        .collect();
    assert!((0..n).any(|i| cells.iter().any(|c| c[i] == b'p') && cells.iter().any(|c| c[i] == b'd')));
    assert!(cells.iter().any(|c| c.contains(&b'w')), "no request waited");
    let html = out_dir().join("bench-serve-16.html");
    let o = wllm(&["trace", path.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("wllmDrawBlockMap") && page.contains("\"first_step\""));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the report makes no network request"
    );
}

#[test]
fn preemptions_in_a_small_pool_show_in_the_trace_while_outputs_stay_solo() {
    let cfg = |trace_steps| EngineConfig {
        model: default_model_path(),
        // 12 blocks of 16 tokens: 6 requests of ~50 + 40 tokens cannot all fit.
        kv_cache_memory: Some(12 * 16 * KvDtype::default().row_bytes(11520)),
        max_model_len: Some(192),
        trace_steps,
        ..Default::default()
    };
    let params = SamplingParams {
        max_tokens: Some(40),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("Write a long list of facts about the number {i}, one per line, with details."))
        .collect();
    let solo_engine = Engine::new(&cfg(0)).unwrap();
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let m = vec![wllm::ChatMessage::new("user", p)];
            solo_engine
                .generate(Prompt::Chat(m), params.clone())
                .unwrap()
                .collect_all()
                .unwrap()
                .token_ids
        })
        .collect();
    drop(solo_engine);
    let engine = Engine::new(&cfg(10_000)).unwrap();
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let m = vec![wllm::ChatMessage::new("user", p)];
            engine.generate(Prompt::Chat(m), params.clone()).unwrap()
        })
        .collect();
    let batched: Vec<Vec<u32>> = streams
        .into_iter()
        .map(|s| s.collect_all().unwrap().token_ids)
        .collect();
    assert_eq!(batched, solo, "batch invariance under preemption");
    let v = engine.trace().unwrap();
    tef::validate(&v).unwrap();
    let path = out_dir().join("preemption.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let preempted = events
        .iter()
        .filter(|e| e["name"] == "preempted" && e["ph"] == "X")
        .count();
    assert!(preempted > 0, "no preemption in a pool of 12 blocks");
    assert!(engine.metrics().unwrap().num_preemptions_total as usize >= preempted);
    let data = report::load(&path).unwrap();
    assert!(
        data["requests"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["cells"].as_str().unwrap().contains('x'))
    );
    // The block map at every step (the pool before the first, each step's
    // changes applied) covers the whole pool, a held block has an owner, and
    // the used count is the step's counter.
    let base = &data["base_map"];
    let mut owners: Vec<i64> = base["owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_i64().unwrap())
        .collect();
    let mut refs: Vec<u64> = base["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert_eq!(owners.len(), 12);
    let changes = data["map_changes"].as_array().unwrap();
    assert!(!changes.is_empty());
    let mut next = changes.iter().peekable();
    for s in data["steps"].as_array().unwrap() {
        let step = s[0].as_u64().unwrap();
        while let Some(c) = next.next_if(|c| c["step"].as_u64() <= Some(step)) {
            for ch in c["changes"].as_array().unwrap() {
                let b = ch[0].as_u64().unwrap() as usize;
                owners[b] = ch[1].as_i64().unwrap();
                refs[b] = ch[2].as_u64().unwrap();
            }
        }
        for (o, r) in owners.iter().zip(&refs) {
            assert_eq!(*o >= 0, *r > 0, "step {step}");
        }
        let used = refs.iter().filter(|&&r| r > 0).count() as u64;
        assert_eq!(Some(used), s[7].as_u64(), "step {step}: blocks used");
    }
}

fn refused(path: &Path, want: &str) {
    let out = out_dir().join("refused.html");
    let o = wllm(&["trace", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{} was accepted", path.display());
    assert!(err.contains(want), "{}: {err}", path.display());
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn wllm_trace_refuses_truncated_foreign_and_missing_files() {
    let d = out_dir();
    let engine = Engine::new(&EngineConfig {
        model: default_model_path(),
        kv_cache_memory: Some(32 << 20),
        trace_steps: 100,
        ..Default::default()
    })
    .unwrap();
    let p = SamplingParams {
        max_tokens: Some(4),
        ..SamplingParams::greedy()
    };
    engine
        .generate(Prompt::Text("Hello".into()), p)
        .unwrap()
        .collect_all()
        .unwrap();
    let whole = engine.trace().unwrap().to_string();
    let truncated = d.join("truncated.json");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    refused(&truncated, "not a complete JSON document");
    let foreign = d.join("foreign.json");
    std::fs::write(
        &foreign,
        r#"{"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]}"#,
    )
    .unwrap();
    refused(&foreign, "not one wllm wrote");
    let broken = d.join("broken.json");
    std::fs::write(
        &broken,
        r#"{"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "ts": 0}]}"#,
    )
    .unwrap();
    refused(&broken, "needs dur");
    let other = d.join("other.json");
    std::fs::write(&other, r#"{"hello": 1}"#).unwrap();
    refused(&other, "traceEvents");
    refused(&d.join("missing.json"), "cannot read");
}

/// Figures for the notes (run by hand: `cargo test --release --test
/// trace_tests trace_cost -- --ignored --nocapture`): 16 concurrent requests
/// (≈130-token prompts, 64 output tokens) on engines without and with a trace,
/// alternated; the mean step time of each, and the recorder's own measured
/// share of the traced steps. Speed is measured, not asserted.
#[test]
#[ignore]
fn trace_cost_on_step_time() {
    let run = |trace_steps: usize| -> (f64, f64) {
        let e = Engine::new(&EngineConfig {
            model: default_model_path(),
            kv_cache_memory: Some(256 << 20),
            trace_steps,
            ..Default::default()
        })
        .unwrap();
        let p = SamplingParams {
            max_tokens: Some(64),
            ignore_eos: true,
            ..SamplingParams::greedy()
        };
        let streams: Vec<_> = (0..16)
            .map(|i| {
                let text = format!("{i} ") + &"Tell me about paged attention and block tables. ".repeat(13);
                e.generate(Prompt::Text(text), p.clone()).unwrap()
            })
            .collect();
        for s in streams {
            s.collect_all().unwrap();
        }
        let m = e.metrics().unwrap();
        (
            1e3 * m.step_seconds_total / m.num_steps_total as f64,
            m.trace_record_seconds_total / m.step_seconds_total,
        )
    };
    let mut off = Vec::new();
    let mut on = Vec::new();
    let mut share = Vec::new();
    for _ in 0..2 {
        off.push(run(0).0);
        let (ms, s) = run(100_000);
        on.push(ms);
        share.push(s);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!(
        "mean step time without a trace {:.1} ms {off:.1?}, with {:.1} ms {on:.1?} ({:+.1} %); recording took {:.3} % of the traced steps' time",
        mean(&off),
        mean(&on),
        100.0 * (mean(&on) / mean(&off) - 1.0),
        100.0 * mean(&share)
    );
}
