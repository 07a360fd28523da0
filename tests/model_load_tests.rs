//! Loading models: the GGUF → Hugging Face converter round trip, and a clear
//! error (never a panic) for every kind of bad input.

mod common;

use std::path::{Path, PathBuf};

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use wllm::engine::LlmEngine;
use wllm::{EngineConfig, EngineError, Prompt, SamplingParams};

fn convert(gguf: &Path, out: &Path) {
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gguf-to-hf"))
        .arg(gguf)
        .arg(out)
        .status()
        .unwrap();
    assert!(st.success(), "gguf-to-hf failed");
}

fn engine_err(model: &Path) -> String {
    let cfg = EngineConfig {
        model: model.to_path_buf(),
        kv_cache_memory: Some(1 << 20),
        ..Default::default()
    };
    match LlmEngine::with_context(&kernels().ctx, &cfg) {
        Ok(_) => panic!("{} loaded, but it is broken", model.display()),
        Err(e) => e.to_string(),
    }
}

fn greedy(core: &mut LlmEngine, prompt: &[u32], n: usize) -> Vec<u32> {
    let s = SamplingParams {
        max_tokens: Some(n),
        ..SamplingParams::greedy()
    };
    let id = core.add_request(prompt.to_vec(), s).unwrap();
    let mut out = Vec::new();
    while core.has_unfinished() {
        for o in core.step().unwrap() {
            assert_eq!(o.id, id);
            out.extend(o.token_ids);
        }
    }
    out
}

#[test]
fn hf_directory_from_the_converter_gives_the_same_tokens() {
    let dir = test_dir("convert_default");
    let hf = dir.join("hf");
    convert(&default_model_path(), &hf);
    let cfg = |m: PathBuf| EngineConfig {
        model: m,
        kv_cache_memory: Some(64 << 20),
        ..Default::default()
    };
    let mut gguf = LlmEngine::with_context(&kernels().ctx, &cfg(default_model_path())).unwrap();
    let mut st = LlmEngine::with_context(&kernels().ctx, &cfg(hf)).unwrap();
    let o = oracle();
    for c in o["cases"].as_array().unwrap().iter().take(4) {
        let text = c["prompt"].as_str().unwrap();
        let a = gguf.tokenize(&Prompt::Text(text.into())).unwrap();
        let b = st.tokenize(&Prompt::Text(text.into())).unwrap();
        assert_eq!(a, b, "tokenizer.json tokenises {text:?} differently");
        assert_eq!(greedy(&mut gguf, &a, 16), greedy(&mut st, &b, 16), "{text:?}");
    }
    for c in o["tokenizer_cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(st.tokenize(&Prompt::Text(text.into())).unwrap(), want, "{text:?}");
    }
    let chat = Prompt::Chat(vec![wllm::ChatMessage::new("user", "hi")]);
    assert_eq!(gguf.tokenize(&chat).unwrap(), st.tokenize(&chat).unwrap());
}

/// Every family from a Hugging Face directory: a tiny f16 GGUF of each (its
/// extra tensors, a window shorter than the prompts) and the directory the
/// converter writes from it (the family's config.json keys and tensor names,
/// Llama's q/k back in rotate-half order, Gemma's norms back to w) read as the
/// same model and generate the same tokens.
#[test]
fn every_family_loads_from_a_hugging_face_directory() {
    for arch in ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"] {
        let dir = test_dir(&format!("convert_{arch}"));
        let spec = TinySpec {
            arch,
            sliding_window: 5,
            layers: 3,
            formats: vec![wllm::quant::WeightFormat::F16],
            ..Default::default()
        };
        let g = write_tiny_gguf(&dir, "tiny.gguf", &spec, &mut rng(3));
        let hf = dir.join("hf");
        convert(&g, &hf);
        let cfg = |m: PathBuf| EngineConfig {
            model: m,
            kv_cache_memory: Some(1 << 20),
            max_model_len: Some(128),
            ..Default::default()
        };
        let mut a = LlmEngine::with_context(&kernels().ctx, &cfg(g)).unwrap();
        let mut b = LlmEngine::with_context(&kernels().ctx, &cfg(hf)).unwrap();
        let (sa, mut sb) = (a.model_config.spec.clone(), b.model_config.spec.clone());
        // Gemma's norms: GGUF holds 1 + w, the directory w and the offset.
        assert_eq!(
            sb.norm_offset,
            if arch.starts_with("gemma") { 1.0 } else { 0.0 },
            "{arch}"
        );
        sb.norm_offset = sa.norm_offset;
        assert_eq!(sa, sb, "{arch}: the directory's config.json reads as another model");
        for n in [3usize, 11, 17] {
            let prompt: Vec<u32> = (0..n).map(|i| ((i * 29 + n * 7) % 250) as u32).collect();
            assert_eq!(
                greedy(&mut a, &prompt, 10),
                greedy(&mut b, &prompt, 10),
                "{arch}, prompt of {n}"
            );
        }
    }
}

fn tiny(name: &str) -> (PathBuf, PathBuf) {
    let dir = test_dir(name);
    let g = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(1));
    (dir, g)
}

#[test]
fn truncated_or_corrupt_gguf_is_refused() {
    let (dir, g) = tiny("bad_gguf");
    let bytes = std::fs::read(&g).unwrap();
    for (name, data) in [
        ("half.gguf", bytes[..bytes.len() / 2].to_vec()),
        ("header.gguf", bytes[..100].to_vec()),
        ("empty.gguf", Vec::new()),
        ("magic.gguf", [b"GGUX".as_slice(), &bytes[4..]].concat()),
        (
            "version.gguf",
            [b"GGUF".as_slice(), &[9, 0, 0, 0], &bytes[8..]].concat(),
        ),
        ("count.gguf", [&bytes[..8], &[0xff; 8], &bytes[16..]].concat()),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        let e = engine_err(&p);
        assert!(
            e.contains("GGUF") || e.contains("truncated") || e.contains("corrupt"),
            "{name}: {e}"
        );
    }
    assert!(engine_err(&dir.join("missing.gguf")).contains("no such file"));
}

fn patch(bytes: &[u8], find: &[u8], replace: &[u8]) -> Vec<u8> {
    let i = bytes
        .windows(find.len())
        .position(|w| w == find)
        .expect("pattern in file");
    let mut b = bytes.to_vec();
    b[i..i + replace.len()].copy_from_slice(replace);
    b
}

#[test]
fn unsupported_architecture_and_tensor_type_are_named() {
    let (dir, g) = tiny("bad_arch");
    let bytes = std::fs::read(&g).unwrap();
    let p = dir.join("arch.gguf");
    std::fs::write(
        &p,
        patch(
            &bytes,
            b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
            b"\x05\x00\x00\x00\x00\x00\x00\x00mamba",
        ),
    )
    .unwrap();
    let e = engine_err(&p);
    assert!(e.contains("unsupported architecture") && e.contains("mamba"), "{e}");
    // blk.0.attn_q.weight: name, 2 dims, then its type, patched to IQ2_XXS (16),
    // a type wllm does not read.
    let name = b"blk.0.attn_q.weight";
    let i = bytes.windows(name.len()).rposition(|w| w == name).unwrap() + name.len() + 4 + 16;
    let mut b = bytes.clone();
    b[i..i + 4].copy_from_slice(&16u32.to_le_bytes());
    let p = dir.join("iq2.gguf");
    std::fs::write(&p, b).unwrap();
    let e = engine_err(&p);
    assert!(e.contains("IQ2_XXS") && e.contains("blk.0.attn_q.weight"), "{e}");
    // Patched to Q4_K (12): a known type whose 256-element blocks do not fit
    // the 64-element rows; refused before any byte of it is read.
    let mut b = bytes.clone();
    b[i..i + 4].copy_from_slice(&12u32.to_le_bytes());
    let p = dir.join("q4k.gguf");
    std::fs::write(&p, b).unwrap();
    let e = engine_err(&p);
    assert!(
        e.contains("Q4_K") && e.contains("multiple of 256") && e.contains("blk.0.attn_q.weight"),
        "{e}"
    );
}

/// A model whose matrices use every type wllm reads (K-quants, 5-bit, IQ4,
/// legacy, floats) generates exactly what its twin with the same values stored
/// as F32 generates (3 layers of 7 matrices cycle through all 15 types).
#[test]
fn every_weight_type_loads_and_generates_as_its_f32_twin() {
    let dir = test_dir("every_type");
    let spec = |twin| TinySpec {
        hidden: 256,
        inter: 512,
        layers: 3,
        formats: wllm::quant::WeightFormat::STORED.to_vec(),
        f32_twin: twin,
        ..TinySpec::default()
    };
    let typed = write_tiny_gguf(&dir, "typed.gguf", &spec(false), &mut rng(9));
    let twin = write_tiny_gguf(&dir, "twin.gguf", &spec(true), &mut rng(9));
    let cfg = |m: PathBuf| EngineConfig {
        model: m,
        kv_cache_memory: Some(8 << 20),
        ..Default::default()
    };
    let mut a = LlmEngine::with_context(&kernels().ctx, &cfg(typed)).unwrap();
    let mut b = LlmEngine::with_context(&kernels().ctx, &cfg(twin)).unwrap();
    for prompt in [vec![256u32, 72, 105], vec![10, 20, 30, 40, 50, 60, 70]] {
        let x = greedy(&mut a, &prompt, 12);
        assert_eq!(x.len(), 12, "generation stopped early");
        assert_eq!(x, greedy(&mut b, &prompt, 12), "prompt {prompt:?}");
    }
}

#[test]
fn bad_safetensors_directories_are_refused() {
    let (dir, g) = tiny("bad_st");
    let hf = dir.join("hf");
    convert(&g, &hf);
    // The converted tiny model loads.
    LlmEngine::with_context(
        &kernels().ctx,
        &EngineConfig {
            model: hf.clone(),
            kv_cache_memory: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let copy = |name: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in std::fs::read_dir(&hf).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), d.join(f.file_name())).unwrap();
        }
        d
    };
    let st = std::fs::read(hf.join("model.safetensors")).unwrap();
    let d = copy("truncated");
    std::fs::write(d.join("model.safetensors"), &st[..st.len() - 1000]).unwrap();
    let e = engine_err(&d);
    assert!(e.contains("corrupt") || e.contains("past"), "{e}");
    let d = copy("garbage");
    std::fs::write(d.join("model.safetensors"), b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    assert!(engine_err(&d).contains("corrupt"));
    // A missing tensor.
    let d = copy("missing");
    let parsed = safetensors::SafeTensors::deserialize(&st).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = parsed
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.1.mlp.up_proj.weight")
        .collect();
    safetensors::serialize_to_file(kept, None, &d.join("model.safetensors")).unwrap();
    let e = engine_err(&d);
    assert!(
        e.contains("missing tensor") && e.contains("model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
    // A shape that contradicts config.json.
    let d = copy("shape");
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"intermediate_size\": 128", "\"intermediate_size\": 160");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    let e = engine_err(&d);
    assert!(e.contains("shape") && e.contains("160"), "{e}");
    // An architecture wllm does not run.
    let d = copy("arch");
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"gpt_neox\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    assert!(engine_err(&d).contains("gpt_neox"));
    // Not a model at all.
    let d = dir.join("empty");
    std::fs::create_dir_all(&d).unwrap();
    assert!(engine_err(&d).contains("neither a .gguf"));
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let (_dir, g) = tiny("long_prompt");
    let cfg = EngineConfig {
        model: g,
        kv_cache_memory: Some(1 << 20),
        max_model_len: Some(256),
        ..Default::default()
    };
    let engine = wllm::Engine::new(&cfg).unwrap();
    let long = Prompt::Tokens(vec![7; 300]);
    match engine.generate(long, SamplingParams::greedy()) {
        Err(EngineError::PromptTooLong {
            prompt: 300,
            max_model_len: 256,
            ..
        }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a 300-token prompt was accepted with a 256-token context"),
    }
    let s = SamplingParams {
        max_tokens: Some(100),
        ..SamplingParams::greedy()
    };
    let e = engine
        .generate(Prompt::Tokens(vec![7; 200]), s)
        .err()
        .expect("200 + 100 > 256")
        .to_string();
    assert!(e.contains("200") && e.contains("256"), "{e}");
}

/// Llama 3 GGUF files carry their rope scaling as `rope_freqs.weight`: it is read
/// and changes the rotary angles (so the outputs), and all-ones changes nothing.
#[test]
fn gguf_rope_freqs_scale_the_rotary_frequencies() {
    let dir = test_dir("rope_freqs");
    let hd = 16;
    let plain = write_tiny_gguf(&dir, "plain.gguf", &TinySpec::default(), &mut rng(4));
    let ones = TinySpec {
        rope_freqs: Some(vec![1.0; hd / 2]),
        ..Default::default()
    };
    let ones = write_tiny_gguf(&dir, "ones.gguf", &ones, &mut rng(4));
    let scaled = TinySpec {
        rope_freqs: Some((0..hd / 2).map(|i| 1.0 + 7.0 * i as f32).collect()),
        ..Default::default()
    };
    let scaled = write_tiny_gguf(&dir, "scaled.gguf", &scaled, &mut rng(4));
    let files = wllm::model::ModelFiles::open(&scaled).unwrap();
    let factors = files.config().unwrap().rope_freq_factors.unwrap();
    assert_eq!(factors.len(), hd / 2);
    assert_eq!(factors[1], 8.0);
    let run = |m: PathBuf| {
        let cfg = EngineConfig {
            model: m,
            kv_cache_memory: Some(1 << 20),
            ..Default::default()
        };
        let mut core = LlmEngine::with_context(&kernels().ctx, &cfg).unwrap();
        let s = SamplingParams {
            max_tokens: Some(24),
            ignore_eos: true,
            logprobs: Some(1),
            ..SamplingParams::greedy()
        };
        let id = core
            .add_request((0..200).map(|i| (i * 7 % 250) as u32).collect(), s)
            .unwrap();
        let mut lps = Vec::new();
        while core.has_unfinished() {
            for o in core.step().unwrap() {
                assert_eq!(o.id, id);
                lps.extend(o.logprobs.iter().map(|l| l.chosen.logprob));
            }
        }
        lps
    };
    let (a, b, c) = (run(plain), run(ones), run(scaled));
    assert_eq!(a, b, "all-ones factors must not change anything");
    assert_ne!(a, c, "scaled frequencies must change the outputs");
}
