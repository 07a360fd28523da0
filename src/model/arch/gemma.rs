//! Gemma 2 and Gemma 3: embeddings × √hidden, four RMSNorms a layer (before
//! and after attention and MLP; the ones after feed the residual adds), a
//! gelu(tanh)-gated MLP, NEOX rope, tied embeddings and sliding-window layers:
//! - Gemma 2: every other layer windowed (layer l when l % 2 == 0), attention
//!   scores soft-capped at 50 and logits at 30;
//! - Gemma 3: five windowed layers to one global (l % 6 < 5), the windowed
//!   ones with rope base 10 000 (the global ones the file's, 1 000 000),
//!   q and k head norms, no soft-caps.
//!
//! The score scale is 1/√query_pre_attn_scalar (llama.cpp: 1/√head_dim, or
//! 1/√(hidden/heads) for the 27B models, which GGUF does not record otherwise).
//!
//! A Hugging Face Gemma stores each norm weight as w and applies 1 + w
//! (`norm_offset`); its `post_attention_layernorm` is the norm after
//! attention, not Llama's norm before the MLP (`pre_feedforward_layernorm`).

use super::{Arch, ArchSpec, GgufKeys};
use crate::backend::{Activation, RopePairing};
use crate::model::ModelError;
use crate::model::hf_config::HfConfig;

pub const GEMMA2: Arch = Arch {
    gguf: &["gemma2"],
    hf: &["gemma2"],
    gguf_pairing: RopePairing::RotateHalf,
    from_gguf: |k| from_gguf(k, 2),
    from_hf: |j| from_hf(j, 2),
    hf_tensor,
};

pub const GEMMA3: Arch = Arch {
    gguf: &["gemma3"],
    hf: &["gemma3_text"],
    gguf_pairing: RopePairing::RotateHalf,
    from_gguf: |k| from_gguf(k, 3),
    from_hf: |j| from_hf(j, 3),
    hf_tensor,
};

fn base(hidden: usize, version: u8) -> ArchSpec {
    ArchSpec {
        qk_norm: version == 3,
        post_norms: true,
        embed_scale: Some((hidden as f32).sqrt()),
        act: Activation::GeluTanh,
        ..ArchSpec::default()
    }
}

fn from_gguf(k: &GgufKeys, version: u8) -> Result<ArchSpec, ModelError> {
    let mut s = base(k.hidden, version);
    // llama.cpp's llm_type 27B: 46 layers (Gemma 2), 62 (Gemma 3).
    let is_27b = (version == 2 && k.layers == 46) || (version == 3 && k.layers == 62);
    let scalar = if is_27b { k.hidden / k.heads } else { k.head_dim };
    s.attn_scale = Some(1.0 / (scalar as f32).sqrt());
    s.sliding_window = k.u("attention.sliding_window").filter(|&w| w > 0);
    if version == 2 {
        s.attn_softcap = k.f("attn_logit_softcapping").map(|v| v as f32);
        s.final_softcap = k.f("final_logit_softcapping").map(|v| v as f32);
        s.set_swa_pattern(k.layers, 2);
    } else {
        s.set_swa_pattern(k.layers, 6);
        s.rope_theta_swa = Some(10_000.0);
    }
    Ok(s)
}

fn from_hf(j: &HfConfig, version: u8) -> Result<ArchSpec, ModelError> {
    let mut s = base(j.hidden_size, version);
    let head_dim = j.head_dim.unwrap_or(j.hidden_size / j.num_attention_heads.max(1));
    let scalar = j.query_pre_attn_scalar.unwrap_or(head_dim as f64);
    s.attn_scale = Some((1.0 / scalar.sqrt()) as f32);
    s.attn_softcap = j.attn_logit_softcapping.map(|v| v as f32);
    s.final_softcap = j.final_logit_softcapping.map(|v| v as f32);
    s.norm_offset = 1.0;
    s.sliding_window = j.sliding_window.filter(|&w| w > 0);
    let layers = j.num_hidden_layers;
    match &j.layer_types {
        Some(types) => {
            s.swa_layers = (0..layers)
                .map(|l| types.get(l).is_some_and(|t| t == "sliding_attention"))
                .collect()
        }
        None => s.set_swa_pattern(
            layers,
            j.sliding_window_pattern.unwrap_or(if version == 2 { 2 } else { 6 }),
        ),
    }
    if version == 3 {
        s.rope_theta_swa = Some(j.rope_local_base_freq.unwrap_or(10_000.0));
    }
    Ok(s)
}

fn hf_tensor(tail: &str) -> Option<&'static str> {
    Some(match tail {
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        _ => return None,
    })
}
