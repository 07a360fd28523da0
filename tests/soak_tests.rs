//! A short `wllm bench soak` on a small model (CI's soak): a mixed load with
//! disconnects and bad requests leaves no block leaked, no request failed.

mod common;

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;

#[test]
fn a_short_soak_leaks_nothing_and_fails_nothing() {
    let dir = test_dir("soak");
    let model = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(5));
    let out = dir.join("soak.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_wllm"))
        .args(["--model", model.to_str().unwrap(), "--kv-cache-memory", "2097152"])
        .args(["bench", "soak", "--duration", "8s", "--concurrency", "6", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["blocks_leaked"], 0, "{v}");
    assert_eq!(v["requests_failed"], 0, "{v}");
    assert_eq!(v["block_pool"], "consistent", "{v}");
    for k in ["requests_ok", "requests_rejected", "requests_aborted"] {
        assert!(v[k].as_u64().unwrap() > 0, "no {k}: {v}");
    }
    eprintln!("{stdout}");
}
