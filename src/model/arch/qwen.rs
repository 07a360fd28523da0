//! Qwen 2 / 2.5 (biases on q, k and v) and Qwen 3 (an RMSNorm of each q and k
//! head before rope, no biases): the Llama layer otherwise, with NEOX
//! (rotate-half) rope in GGUF files too. As in llama.cpp, Qwen 2's
//! `use_sliding_window` is not honoured (its released models leave it off).

use super::{Arch, ArchSpec};
use crate::backend::RopePairing;
use crate::model::ModelError;
use crate::model::hf_config::HfConfig;

pub const QWEN2: Arch = Arch {
    gguf: &["qwen2"],
    hf: &["qwen2"],
    gguf_pairing: RopePairing::RotateHalf,
    from_gguf: |_| Ok(qwen2()),
    from_hf: |_| Ok(qwen2()),
    hf_tensor,
};

pub const QWEN3: Arch = Arch {
    gguf: &["qwen3"],
    hf: &["qwen3"],
    gguf_pairing: RopePairing::RotateHalf,
    from_gguf: |_| Ok(qwen3()),
    from_hf: from_hf3,
    hf_tensor,
};

fn qwen2() -> ArchSpec {
    ArchSpec {
        qkv_bias: true,
        ..ArchSpec::default()
    }
}

fn qwen3() -> ArchSpec {
    ArchSpec {
        qk_norm: true,
        ..ArchSpec::default()
    }
}

fn from_hf3(j: &HfConfig) -> Result<ArchSpec, ModelError> {
    Ok(ArchSpec {
        qkv_bias: j.attention_bias.unwrap_or(false),
        ..qwen3()
    })
}

fn hf_tensor(tail: &str) -> Option<&'static str> {
    Some(match tail {
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        _ => return None,
    })
}
