//! A Hugging Face Llama directory as GGUF for `wllm quantize`: llama.cpp's
//! metadata keys from config.json, the byte-level BPE tokenizer of
//! tokenizer.json as `tokenizer.ggml.*` (tokens by id, merges, token types,
//! the pre-tokenizer by name, BOS/EOS and the chat template), and the tensors
//! under GGUF names with q/k rows permuted to GGUF's adjacent-pair rotary
//! order (as llama.cpp's convert_hf_to_gguf.py does).

use std::path::Path;

use crate::model::gguf_writer::Metadata;
use crate::model::{ModelConfig, ModelError};
use crate::tokenizer::Tokenizer;

fn bad(dir: &Path, what: impl std::fmt::Display) -> ModelError {
    ModelError::Config(format!("{}: {what}", dir.join("tokenizer.json").display()))
}

/// The llama.cpp pre-tokenizer name of tokenizer.json's pre_tokenizer, for the
/// kinds wllm's GGUF tokenizer knows.
fn pre_name(pre: &serde_json::Value) -> Option<&'static str> {
    let kind = |v: &serde_json::Value| v["type"].as_str().unwrap_or_default().to_string();
    match kind(pre).as_str() {
        "ByteLevel" => Some("default"),
        "Sequence" => {
            let parts = pre["pretokenizers"].as_array()?;
            let kinds: Vec<String> = parts.iter().map(kind).collect();
            match kinds.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                ["Digits", "ByteLevel"] if parts[0]["individual_digits"].as_bool() == Some(true) => Some("smollm"),
                ["Split", "ByteLevel"] => {
                    let re = parts[0]["pattern"]["Regex"].as_str().unwrap_or_default();
                    (re == crate::tokenizer::LLAMA3_REGEX).then_some("llama-bpe")
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Writes llama.cpp's metadata for `dir` (a Llama HF directory) into `meta`.
pub fn metadata(dir: &Path, cfg: &ModelConfig, meta: &mut Metadata) -> Result<(), ModelError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    meta.string("general.architecture", "llama");
    meta.string("general.name", &name);
    meta.u32("llama.block_count", cfg.layers as u32);
    meta.u32("llama.context_length", cfg.max_context as u32);
    meta.u32("llama.embedding_length", cfg.hidden as u32);
    meta.u32("llama.feed_forward_length", cfg.intermediate as u32);
    meta.u32("llama.attention.head_count", cfg.heads as u32);
    meta.u32("llama.attention.head_count_kv", cfg.kv_heads as u32);
    meta.u32("llama.attention.key_length", cfg.head_dim as u32);
    meta.u32("llama.attention.value_length", cfg.head_dim as u32);
    meta.u32("llama.rope.dimension_count", cfg.head_dim as u32);
    meta.f32("llama.rope.freq_base", cfg.rope_theta as f32);
    meta.f32("llama.attention.layer_norm_rms_epsilon", cfg.rms_eps);
    meta.u32("llama.vocab_size", cfg.vocab as u32);

    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io(path.display().to_string(), e))?;
    let j: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(dir, e))?;
    let model = &j["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(bad(dir, "only byte-level BPE tokenizers can be written to GGUF"));
    }
    let pre = pre_name(&j["pre_tokenizer"]).ok_or_else(|| {
        bad(
            dir,
            "its pre_tokenizer is none wllm can name for GGUF (byte-level, SmolLM's, Llama 3's)",
        )
    })?;
    let mut tokens = vec![String::new(); cfg.vocab];
    let mut types = vec![0i32; cfg.vocab];
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad(dir, "model.vocab is missing"))?;
    let mut put = |id: u64, tok: &str, ty: i32| -> Result<(), ModelError> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(
                dir,
                format!("token id {id} is past the model's vocabulary of {}", cfg.vocab),
            )
        })?;
        *slot = tok.to_string();
        types[id as usize] = ty;
        Ok(())
    };
    for (tok, id) in vocab {
        put(
            id.as_u64().ok_or_else(|| bad(dir, "a vocab id is not a number"))?,
            tok,
            1,
        )?;
    }
    for a in j["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(tok)) = (a["id"].as_u64(), a["content"].as_str()) else {
            return Err(bad(dir, "an added token lacks id or content"));
        };
        put(id, tok, if a["special"].as_bool() == Some(true) { 3 } else { 4 })?;
    }
    // Ids no token names (a vocabulary padded for the GPU) become unused pads.
    for (i, (t, ty)) in tokens.iter_mut().zip(types.iter_mut()).enumerate() {
        if *ty == 0 {
            *t = format!("[PAD{i}]");
            *ty = 5;
        }
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .ok_or_else(|| bad(dir, "model.merges is missing"))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => Ok(format!(
                "{} {}",
                p[0].as_str().unwrap_or_default(),
                p[1].as_str().unwrap_or_default()
            )),
            _ => Err(bad(dir, "a merge is neither \"a b\" nor [a, b]")),
        })
        .collect::<Result<_, _>>()?;
    let tok = Tokenizer::from_hf_dir(dir).map_err(|e| ModelError::Config(e.to_string()))?;
    meta.string("tokenizer.ggml.model", "gpt2");
    meta.string("tokenizer.ggml.pre", pre);
    meta.strings("tokenizer.ggml.tokens", &tokens);
    meta.i32s("tokenizer.ggml.token_type", &types);
    meta.strings("tokenizer.ggml.merges", &merges);
    if let Some(b) = tok.bos_id {
        meta.u32("tokenizer.ggml.bos_token_id", b);
    }
    if let Some(&e) = tok.eos_ids.first() {
        meta.u32("tokenizer.ggml.eos_token_id", e);
    }
    if let Some(&e) = tok.eos_ids.get(1) {
        meta.u32("tokenizer.ggml.eot_token_id", e);
    }
    meta.bool("tokenizer.ggml.add_bos_token", tok.add_bos);
    if let Some(t) = &tok.chat_template {
        meta.string("tokenizer.chat_template", t);
    }
    Ok(())
}

/// The GGUF tensor names of a Llama model, in llama.cpp's order.
pub fn tensor_names(cfg: &ModelConfig, has_output: bool) -> Vec<String> {
    let mut v = vec!["token_embd.weight".to_string()];
    for l in 0..cfg.layers {
        for t in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            v.push(format!("blk.{l}.{t}.weight"));
        }
    }
    v.push("output_norm.weight".into());
    if has_output {
        v.push("output.weight".into());
    }
    v
}

/// HF rows of a q/k matrix in GGUF order: gguf[h·hd + 2i + j] = hf[h·hd + j·hd/2 + i].
pub fn permute_rows(w: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = (h * hd + 2 * i + j) * cols;
                let src = (h * hd + j * hd / 2 + i) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}
