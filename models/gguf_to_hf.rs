//! gguf-to-hf: turns a GGUF file of any family wllm runs (Llama, Qwen 2/3,
//! Gemma 2/3, Phi-3) into a Hugging Face directory — config.json with the
//! family's keys, model.safetensors under the family's tensor names (matrices
//! as f16, vectors as f32; Llama's q and k rows un-permuted back to
//! rotate-half order; Gemma's norms back to w where GGUF holds 1 + w),
//! tokenizer.json, tokenizer_config.json and generation_config.json.
//!
//! Usage: gguf-to-hf MODEL.gguf OUT_DIR

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use half::f16;
use safetensors::tensor::{Dtype, TensorView};
use wllm::backend::{Activation, RopePairing};
use wllm::model::arch::by_gguf;
use wllm::model::{ModelConfig, ModelFiles, hf_tensor_name_for};
use wllm::quant::dequantize;
use wllm::tokenizer::Tokenizer;

/// GGUF rows of a q/k matrix back in HF order: hf[h·hd + j·hd/2 + i] = gguf[h·hd + 2i + j].
fn unpermute(w: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let src = (h * hd + 2 * i + j) * cols;
                let dst = (h * hd + j * hd / 2 + i) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

/// config.json for `c`, under its family's `model_type` and keys.
fn config_json(c: &ModelConfig, model_type: &str) -> anyhow::Result<serde_json::Value> {
    if c.rope_freq_factors.is_some() {
        bail!("the converter does not write rope_scaling (this file has rope_freqs)");
    }
    let s = &c.spec;
    let mut j = serde_json::json!({
        "architectures": [],
        "model_type": model_type,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate,
        "vocab_size": c.vocab,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_context,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": match s.act {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
        },
        "torch_dtype": "float16",
    });
    let mut put = |k: &str, v: serde_json::Value| j[k] = v;
    if model_type == "qwen3" {
        put("attention_bias", s.qkv_bias.into());
    }
    if let Some(scale) = s.attn_scale {
        put("query_pre_attn_scalar", (1.0 / f64::from(scale).powi(2)).round().into());
    }
    if let Some(v) = s.attn_softcap {
        put("attn_logit_softcapping", f64::from(v).into());
    }
    if let Some(v) = s.final_softcap {
        put("final_logit_softcapping", f64::from(v).into());
    }
    if let Some(w) = s.sliding_window {
        put("sliding_window", w.into());
        if !s.swa_layers.is_empty() {
            let types: Vec<&str> = (0..c.layers)
                .map(|l| {
                    if s.window(l).is_some() {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            put("layer_types", types.into());
        }
    }
    if let Some(t) = s.rope_theta_swa {
        put("rope_local_base_freq", t.into());
    }
    Ok(j)
}

fn convert(src: &Path, out: &Path) -> anyhow::Result<()> {
    let files = ModelFiles::open(src)?;
    let ModelFiles::Gguf { file, .. } = &files else {
        bail!("{} is not a GGUF file", src.display())
    };
    let cfg = files.config()?;
    let Some(arch) = by_gguf(&cfg.arch) else {
        bail!("no Hugging Face family for architecture {}", cfg.arch)
    };
    let config = config_json(&cfg, arch.hf[0])?;
    // What the loader adds to the family's norms read from config.json (Gemma: 1).
    let norm_offset = ModelConfig::from_hf_json(&config.to_string())?.spec.norm_offset;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<&String> = file.tensors.keys().collect();
    names.sort();
    for name in names {
        let Some(hf) = hf_tensor_name_for(Some(arch), name) else {
            continue;
        };
        let t = files.tensor(name)?;
        let mut v = dequantize(t.format, &t.bytes, t.rows, t.cols)?;
        if arch.gguf_pairing == RopePairing::Adjacent {
            if name.ends_with("attn_q.weight") {
                v = unpermute(&v, cfg.heads, cfg.head_dim, t.cols);
            } else if name.ends_with("attn_k.weight") {
                v = unpermute(&v, cfg.kv_heads, cfg.head_dim, t.cols);
            }
        }
        if name.ends_with("norm.weight") && norm_offset != 0.0 {
            v.iter_mut().for_each(|x| *x -= norm_offset);
        }
        let (dtype, shape, bytes) = if t.rows == 1 {
            (
                Dtype::F32,
                vec![t.cols],
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        } else {
            (
                Dtype::F16,
                vec![t.rows, t.cols],
                v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            )
        };
        data.push((hf, dtype, shape, bytes));
    }
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(n, d, s, b)| Ok((n.clone(), TensorView::new(*d, s.clone(), b)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, &out.join("model.safetensors"))?;
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    let tok = Tokenizer::from_gguf(file)?;
    tok.save_json(&out.join("tokenizer.json"))?;
    let (bos, eos) = tok.special_token_strings();
    let tc = serde_json::json!({
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
    });
    std::fs::write(out.join("tokenizer_config.json"), serde_json::to_string_pretty(&tc)?)?;
    let gc = serde_json::json!({ "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_ids });
    std::fs::write(out.join("generation_config.json"), serde_json::to_string_pretty(&gc)?)?;
    Ok(())
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if args.len() != 2 {
        eprintln!("usage: gguf-to-hf MODEL.gguf OUT_DIR");
        std::process::exit(2);
    }
    if let Err(e) = convert(&args[0], &args[1]) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    println!("{}", args[1].display());
}
