//! The server's pages and a trace report in a real browser: headless Chromium
//! (Debian's `chromium`; scripts/test.sh installs it) driven over the DevTools
//! protocol by tests/py/browser_check.py — the chat page streams a reply that
//! names Paris and its Stop button aborts a long reply on the server, the
//! engine page shows 4 running requests and a block map, the
//! report renders with no console errors. Screenshots: target/screenshots/.
//! Without Chromium the check fails with the install command (tests/py/cdp.py).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use wllm::server::ServerConfig;
use wllm::{Engine, EngineConfig, Prompt, SamplingParams};

#[test]
fn chat_page_engine_page_and_trace_report_work_in_headless_chromium() {
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let engine = Engine::new(&EngineConfig {
        model: default_model_path(),
        kv_cache_memory: Some(96 << 20),
        trace_steps: 1000,
        ..Default::default()
    })
    .unwrap();
    // A small trace for the report: two requests sharing a prompt prefix.
    let p = SamplingParams {
        max_tokens: Some(8),
        ..SamplingParams::greedy()
    };
    let long = "The paged KV cache keeps each sequence's keys and values in fixed-size blocks. ".repeat(4);
    let streams: Vec<_> = ["Why?", "How?"]
        .iter()
        .map(|q| engine.generate(Prompt::Text(format!("{long}{q}")), p.clone()).unwrap())
        .collect();
    for s in streams {
        s.collect_all().unwrap();
    }
    let trace = out.join("browser-trace.json");
    std::fs::write(&trace, engine.trace().unwrap().to_string()).unwrap();
    let report = out.join("browser-report.html");
    let data = wllm::trace::report::load(&trace).unwrap();
    std::fs::write(&report, wllm::trace::report::render(&data)).unwrap();

    let cfg = ServerConfig {
        served_model_name: "smollm2".into(),
        ..Default::default()
    };
    let (_rt, addr) = serve_in_background(&engine, cfg);
    let base = format!("http://{addr}");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/browser_check.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&base)
        .arg(&report)
        .arg(&out)
        .output()
        .expect("python3 runs tests/py/browser_check.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{text}");
    assert!(o.status.success(), "the browser check failed:\n{text}");
    for f in ["chat.png", "engine.png", "report.png"] {
        let len = std::fs::metadata(out.join(f)).map_or(0, |m| m.len());
        assert!(len > 10_000, "{f}: {len} bytes");
    }
}
