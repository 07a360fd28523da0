//! The quantiser against llama.cpp's gguf-py: the legacy types bit for bit
//! with `gguf.quants.quantize`; the K-quants within their formats' error and
//! read back by gguf-py as wllm reads them.

mod common;

use common::*;
use rand::Rng;
use wllm::quant::{self, WeightFormat, quantize::quantize};

/// Rows of weight-like values: Gaussian-ish, with an all-zero block, a block
/// of ties and a few outliers (the awkward cases of each rounding rule).
fn weights(seed: u64, n: usize, k: usize) -> Vec<f32> {
    let mut r = rng(seed);
    let mut x: Vec<f32> = (0..n * k)
        .map(|_| {
            let s: f32 = (0..4).map(|_| r.random_range(-1.0f32..1.0)).sum();
            0.05 * s
        })
        .collect();
    x[..32].fill(0.0);
    x[32..64].fill(0.25);
    x[64 + 7] = 3.0;
    x[n * k - 5] = -2.5;
    x
}

#[test]
fn legacy_types_equal_gguf_py_bit_for_bit() {
    for format in [
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::F16,
        WeightFormat::Bf16,
    ] {
        let (n, k) = (6, 320);
        let x = weights(11, n, k);
        let ours = quantize(format, &x, n, k).unwrap();
        let theirs = gguf_py::quantize(format, &x, n);
        assert_eq!(ours.len(), theirs.len(), "{format:?} size");
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert!(first.is_none(), "{format:?}: first differing byte {first:?}");
    }
}

/// RMS error of the round trip over RMS of the values, the format's bound:
/// about 0.5 of a quantisation step over the spread a sub-block's scale covers.
fn bound(format: WeightFormat) -> f64 {
    match format {
        WeightFormat::Q2_K => 0.45,
        WeightFormat::Q3_K => 0.22,
        WeightFormat::Q4_K => 0.11,
        WeightFormat::Q5_K => 0.055,
        WeightFormat::Q6_K => 0.03,
        _ => unreachable!(),
    }
}

#[test]
fn k_quants_round_trip_within_their_bound_and_gguf_py_reads_them() {
    for (fi, format) in [
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let (n, k) = (8, 768);
        let x = weights(20 + fi as u64, n, k);
        let bytes = quantize(format, &x, n, k).unwrap();
        assert_eq!(bytes.len(), format.stored_bytes(n, k));
        let ours = quant::dequantize(format, &bytes, n, k).unwrap();
        let theirs = gguf_py::dequantize(format, &bytes, n);
        assert_eq!(ours, theirs, "{format:?}: wllm and gguf-py read the blocks differently");
        // Zero blocks stay zero; the error is measured on the rest.
        assert!(ours[..32].iter().all(|&v| v == 0.0), "{format:?} zero block");
        let (mut se, mut sx) = (0f64, 0f64);
        for (a, b) in x.iter().zip(&ours) {
            se += f64::from(a - b).powi(2);
            sx += f64::from(*a).powi(2);
        }
        let rel = (se / sx).sqrt();
        eprintln!("{format:?}: relative RMS error {rel:.4}");
        assert!(
            rel <= bound(format),
            "{format:?}: relative RMS error {rel:.4} over {}",
            bound(format)
        );
    }
}

#[test]
fn finer_k_quants_are_more_precise() {
    let (n, k) = (4, 512);
    let x = weights(5, n, k);
    let err = |f: WeightFormat| -> f64 {
        let y = quant::dequantize(f, &quantize(f, &x, n, k).unwrap(), n, k).unwrap();
        x.iter().zip(&y).map(|(a, b)| f64::from(a - b).powi(2)).sum()
    };
    let e: Vec<f64> = [
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::Q8_0,
    ]
    .into_iter()
    .map(err)
    .collect();
    assert!(e.windows(2).all(|w| w[0] > w[1]), "errors not decreasing: {e:?}");
}

#[test]
fn bad_quantize_input_is_refused() {
    let x = vec![0.5f32; 2 * 576];
    let e = quantize(WeightFormat::Q4_K, &x, 2, 576).unwrap_err().to_string();
    assert!(e.contains("multiple of 256"), "{e}");
    let e = quantize(WeightFormat::IQ4_NL, &x, 2, 576).unwrap_err().to_string();
    assert!(e.contains("cannot write"), "{e}");
    assert!(quantize(WeightFormat::Q8_0, &x, 3, 576).is_err());
}

/// The tensor types llama.cpp's `llama-quantize` (0.3.36, --allow-requantize)
/// wrote for each mix of the default model; wllm's files were also compared
/// with those byte for byte when this was written (every tensor identical).
/// A mix, its tensors' types with their counts, and its `general.file_type`.
type MixTypes = (&'static str, &'static [(&'static str, usize)], u32);

const LLAMA_QUANTIZE_TYPES: [MixTypes; 13] = [
    ("Q8_0", &[("F32", 61), ("Q8_0", 211)], 7),
    ("Q6_K", &[("F32", 61), ("Q6_K", 30), ("Q8_0", 181)], 18),
    (
        "Q5_K_M",
        &[("F32", 61), ("Q5_1", 166), ("Q5_K", 16), ("Q6_K", 14), ("Q8_0", 15)],
        17,
    ),
    ("Q5_K_S", &[("F32", 61), ("Q5_1", 180), ("Q5_K", 30), ("Q8_0", 1)], 16),
    ("Q5_1", &[("F32", 61), ("Q5_1", 210), ("Q8_0", 1)], 9),
    ("Q5_0", &[("F32", 61), ("Q5_0", 210), ("Q8_0", 1)], 8),
    (
        "Q4_K_M",
        &[("F32", 61), ("Q4_K", 16), ("Q5_0", 166), ("Q6_K", 14), ("Q8_0", 15)],
        15,
    ),
    (
        "Q4_K_S",
        &[
            ("F32", 61),
            ("Q4_K", 27),
            ("Q5_0", 176),
            ("Q5_1", 4),
            ("Q5_K", 3),
            ("Q8_0", 1),
        ],
        14,
    ),
    ("Q4_0", &[("F32", 61), ("Q4_0", 210), ("Q8_0", 1)], 2),
    (
        "Q3_K_L",
        &[("F32", 61), ("Q4_0", 120), ("Q5_1", 60), ("Q5_K", 30), ("Q8_0", 1)],
        13,
    ),
    (
        "Q3_K_M",
        &[
            ("F32", 61),
            ("Q4_0", 120),
            ("Q4_K", 29),
            ("Q5_0", 58),
            ("Q5_1", 2),
            ("Q5_K", 1),
            ("Q8_0", 1),
        ],
        12,
    ),
    ("Q3_K_S", &[("F32", 61), ("Q3_K", 30), ("Q4_0", 180), ("Q8_0", 1)], 11),
    ("Q2_K", &[("F32", 61), ("Q3_K", 30), ("Q4_0", 180), ("Q8_0", 1)], 10),
];

#[test]
fn every_mix_of_the_default_model_has_llama_quantizes_types_and_gguf_py_reads_it() {
    use wllm::convert::quantize_model;
    use wllm::model::gguf::GgufFile;
    use wllm::quant::mix::Mix;
    let dir = test_dir("mixes");
    for (name, want, file_type) in LLAMA_QUANTIZE_TYPES {
        let out = dir.join(format!("{name}.gguf"));
        let mix = Mix::from_name(name).unwrap();
        let mut calls = 0;
        let report = quantize_model(&default_model_path(), &out, mix, |_, _, _| calls += 1).unwrap();
        assert_eq!(calls, 273, "{name}: a progress call per tensor and one at the end");
        let mut got: Vec<(String, usize)> = Vec::new();
        for (_, _, to) in &report.tensors {
            match got.iter_mut().find(|(t, _)| t == to) {
                Some(c) => c.1 += 1,
                None => got.push((to.clone(), 1)),
            }
        }
        got.sort();
        let want: Vec<(String, usize)> = want.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        assert_eq!(got, want, "{name}");
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(g.metadata["general.file_type"].as_u64(), Some(u64::from(file_type)));
        assert_eq!(
            g.metadata["tokenizer.ggml.tokens"],
            GgufFile::open(&default_model_path()).unwrap().metadata["tokenizer.ggml.tokens"]
        );
        // gguf-py reads every tensor as wllm does (three mixes cover every type
        // written: Q4_K, Q5_0, Q6_K, Q8_0; Q4_0, Q5_1, Q5_K; Q3_K).
        if ["Q4_K_M", "Q3_K_M", "Q2_K"].contains(&name) {
            for (tname, ty, vals) in gguf_py::tensors(&out) {
                let t = &g.tensors[&tname];
                let f = WeightFormat::from_ggml_type(t.ggml_type).unwrap();
                assert_eq!(f.name(), ty, "{tname}");
                let k = t.dims[0] as usize;
                let ours = quant::dequantize(f, g.bytes(t), vals.len() / k, k).unwrap();
                assert!(ours == vals, "{name}: gguf-py reads {tname} ({ty}) differently");
            }
        }
        drop(g);
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn quantize_at_load_equals_the_written_file() {
    use wllm::engine::LlmEngine;
    use wllm::quant::mix::Mix;
    use wllm::{EngineConfig, Prompt, SamplingParams};
    let dir = test_dir("at_load");
    let file = dir.join("q4km.gguf");
    wllm::convert::quantize_model(&default_model_path(), &file, Mix::Q4_K_M, |_, _, _| ()).unwrap();
    let run = |model: std::path::PathBuf, quantize: Option<Mix>| {
        let cfg = EngineConfig {
            model,
            quantize,
            kv_cache_memory: Some(16 << 20),
            ..Default::default()
        };
        let mut e = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
        let ids = e.tokenize(&Prompt::Text("The capital of France is".into())).unwrap();
        let s = SamplingParams {
            max_tokens: Some(8),
            ..SamplingParams::greedy()
        };
        e.add_request(ids, s).unwrap();
        let mut out = Vec::new();
        while e.has_unfinished() {
            e.step().unwrap().into_iter().for_each(|o| out.extend(o.token_ids));
        }
        out
    };
    let a = run(default_model_path(), Some(Mix::Q4_K_M));
    assert!(!a.is_empty());
    assert_eq!(a, run(file, None));
}

#[test]
fn quantize_refuses_bad_input_clearly() {
    let dir = test_dir("q_bad");
    let bin = env!("CARGO_BIN_EXE_wllm");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(bin).args(args).output().unwrap();
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let out = dir.join("o.gguf");
    let model = default_model_path();
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    assert!(run(&["quantize", m, o, "Q7_K"]).contains("unknown quantisation type"));
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let e = run(&["quantize", junk.to_str().unwrap(), o, "Q4_K_M"]);
    assert!(e.contains("GGUF") || e.contains("corrupt"), "{e}");
    assert!(
        !out.exists() && !dir.join("o.gguf.partial").exists(),
        "nothing half-written is left"
    );
    assert!(run(&["quantize", m, m, "Q8_0"]).contains("is the input"));
}

/// Perplexity on the README (6 windows of 128) orders the mixes by their bits:
/// Q2_K above Q4_K_M above Q8_0; the two ways of running it agree.
#[test]
fn perplexity_orders_q2_k_above_q4_k_m_above_q8_0() {
    use wllm::EngineConfig;
    use wllm::convert::quantize_model;
    use wllm::engine::LlmEngine;
    use wllm::quant::mix::Mix;
    let dir = test_dir("ppl");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut ppl = Vec::new();
    for mix in [Mix::Q2_K, Mix::Q4_K_M, Mix::Q8_0] {
        let file = dir.join(format!("{}.gguf", mix.name()));
        quantize_model(&default_model_path(), &file, mix, |_, _, _| ()).unwrap();
        let cfg = EngineConfig {
            model: file,
            kv_cache_memory: Some(16 << 20),
            max_num_batched_tokens: 128,
            max_num_seqs: 128,
            max_model_len: Some(128),
            ..Default::default()
        };
        let mut e = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
        let tokens = e.tokenizer.encode(&text).unwrap();
        let mut seen = Vec::new();
        let p = e
            .perplexity(&tokens, 128, Some(6), |done, total, p| {
                seen.push((done, total, p.value()))
            })
            .unwrap();
        assert_eq!((p.windows, p.scored), (6, 6 * 63), "{mix:?}");
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[5], (6, 6, p.value()));
        assert!(p.value().is_finite() && p.value() > 1.0, "{mix:?}: {}", p.value());
        eprintln!("{mix:?}: PPL {:.3} +/- {:.3}", p.value(), p.uncertainty());
        ppl.push(p.value());
    }
    assert!(ppl[0] > ppl[1] && ppl[1] > ppl[2], "PPL Q2_K, Q4_K_M, Q8_0 = {ppl:?}");
}

#[test]
fn perplexity_refuses_a_text_shorter_than_a_window() {
    use wllm::EngineConfig;
    use wllm::engine::LlmEngine;
    let cfg = EngineConfig {
        model: default_model_path(),
        kv_cache_memory: Some(16 << 20),
        ..Default::default()
    };
    let mut e = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
    let err = e
        .perplexity(&[1, 2, 3], 512, None, |_, _, _| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least one window"), "{err}");
    let err = e.perplexity(&[1, 2, 3], 2, None, |_, _, _| ()).unwrap_err().to_string();
    assert!(err.contains("too small"), "{err}");
}

/// A Hugging Face directory (made from the default GGUF by gguf-to-hf) written
/// as a Q8_0 GGUF: llama.cpp's tokenizer metadata round-trips exactly, gguf-py
/// reads every tensor, and it generates what the directory quantised at load
/// generates.
#[test]
fn an_hf_directory_quantizes_to_a_gguf_with_the_same_tokenizer() {
    use wllm::convert::quantize_model;
    use wllm::engine::LlmEngine;
    use wllm::model::gguf::GgufFile;
    use wllm::quant::mix::Mix;
    use wllm::{EngineConfig, Prompt, SamplingParams};
    let dir = test_dir("hf_quantize");
    let hf = dir.join("hf");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gguf-to-hf"))
        .arg(default_model_path())
        .arg(&hf)
        .output()
        .unwrap();
    assert!(st.status.success(), "gguf-to-hf failed");
    let out = dir.join("hf-q8_0.gguf");
    quantize_model(&hf, &out, Mix::Q8_0, |_, _, _| ()).unwrap();
    let (a, b) = (
        GgufFile::open(&out).unwrap(),
        GgufFile::open(&default_model_path()).unwrap(),
    );
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.chat_template",
        "llama.block_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
    ] {
        assert_eq!(a.metadata.get(key), b.metadata.get(key), "{key}");
    }
    assert_eq!(a.order.len(), b.order.len());
    for (name, ty, vals) in gguf_py::tensors(&out) {
        let t = &a.tensors[&name];
        let f = WeightFormat::from_ggml_type(t.ggml_type).unwrap();
        assert_eq!(f.name(), ty);
        let k = t.dims[0] as usize;
        assert!(
            quant::dequantize(f, a.bytes(t), vals.len() / k, k).unwrap() == vals,
            "{name}"
        );
    }
    let run = |model: std::path::PathBuf, quantize: Option<Mix>| {
        let cfg = EngineConfig {
            model,
            quantize,
            kv_cache_memory: Some(16 << 20),
            ..Default::default()
        };
        let mut e = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
        let ids = e.tokenize(&Prompt::Text("Once upon a time".into())).unwrap();
        let s = SamplingParams {
            max_tokens: Some(8),
            ..SamplingParams::greedy()
        };
        e.add_request(ids, s).unwrap();
        let mut toks = Vec::new();
        while e.has_unfinished() {
            e.step().unwrap().into_iter().for_each(|o| toks.extend(o.token_ids));
        }
        toks
    };
    assert_eq!(run(out, None), run(hf, Some(Mix::Q8_0)));
}
