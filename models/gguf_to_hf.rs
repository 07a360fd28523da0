//! gguf-to-hf: turns a Llama GGUF file into a Hugging Face directory —
//! config.json, model.safetensors (matrices as f16, norms as f32; q and k rows
//! un-permuted back to rotate-half order), tokenizer.json, tokenizer_config.json
//! and generation_config.json.
//!
//! Usage: gguf-to-hf MODEL.gguf OUT_DIR

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use half::f16;
use safetensors::tensor::{Dtype, TensorView};
use wllm::model::{ModelConfig, ModelFiles, hf_tensor_name};
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

fn config_json(c: &ModelConfig) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "hidden_act": "silu",
        "torch_dtype": "float16",
    })
}

fn convert(src: &Path, out: &Path) -> anyhow::Result<()> {
    let files = ModelFiles::open(src)?;
    let ModelFiles::Gguf { file, .. } = &files else {
        bail!("{} is not a GGUF file", src.display())
    };
    let cfg = files.config()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<&String> = file.tensors.keys().collect();
    names.sort();
    for name in names {
        let Some(hf) = hf_tensor_name(name) else { continue };
        let t = files.tensor(name)?;
        let mut v = dequantize(t.format, &t.bytes, t.rows, t.cols)?;
        if name.ends_with("attn_q.weight") {
            v = unpermute(&v, cfg.heads, cfg.head_dim, t.cols);
        } else if name.ends_with("attn_k.weight") {
            v = unpermute(&v, cfg.kv_heads, cfg.head_dim, t.cols);
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
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config_json(&cfg))?,
    )?;
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
