//! llama.cpp's gguf-py as the independent reference of the quantisation tests
//! (tests/py/gguf_ref.py). A missing Python or gguf package is a failure that
//! says how to install it, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use wllm::quant::WeightFormat;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/gguf_ref.py")
}

/// A scratch directory of its own for one call.
pub fn scratch(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let i = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("wllm-gguf-py-{}-{tag}-{i}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

pub fn run(args: &[&str]) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 could not start ({e}): install Python 3 and `python3 -m pip install gguf`")
        });
    assert!(
        out.status.success(),
        "gguf_ref.py {args:?} failed: {}\n(the README's test command installs gguf; else `python3 -m pip install gguf`)",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn f32s(p: &Path) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&std::fs::read(p).expect("gguf_ref output"))
}

/// gguf-py's dequantisation of `rows` rows of stored blocks.
pub fn dequantize(format: WeightFormat, bytes: &[u8], rows: usize) -> Vec<f32> {
    let d = scratch("dq");
    std::fs::write(d.join("in"), bytes).unwrap();
    let (i, o) = (d.join("in"), d.join("out"));
    run(&[
        "dequantize",
        &format.name(),
        &rows.to_string(),
        i.to_str().unwrap(),
        o.to_str().unwrap(),
    ]);
    let v = f32s(&o);
    let _ = std::fs::remove_dir_all(&d);
    v
}

/// `gguf.quants.quantize` of `rows` rows of `vals`.
pub fn quantize(format: WeightFormat, vals: &[f32], rows: usize) -> Vec<u8> {
    let d = scratch("q");
    std::fs::write(d.join("in"), bytemuck::cast_slice(vals)).unwrap();
    let (i, o) = (d.join("in"), d.join("out"));
    run(&[
        "quantize",
        &format.name(),
        &rows.to_string(),
        i.to_str().unwrap(),
        o.to_str().unwrap(),
    ]);
    let v = std::fs::read(&o).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    v
}

/// Every tensor of a GGUF file as gguf-py reads it: (name, type name, values).
pub fn tensors(gguf: &Path) -> Vec<(String, String, Vec<f32>)> {
    let d = scratch("t");
    run(&["tensors", gguf.to_str().unwrap(), d.to_str().unwrap()]);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&d).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "type") {
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            let ty = std::fs::read_to_string(&p).unwrap();
            out.push((name, ty, f32s(&p.with_extension("f32"))));
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
