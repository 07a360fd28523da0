//! Phi-3 / 3.5: the Llama layer with q, k and v stored as one `attn_qkv`
//! tensor and gate and up as one `ffn_up` (gate rows first), split at load;
//! NEOX rope. As in llama.cpp, its `sliding_window` is not applied (its GGUF
//! and config files give a window that the models were not run with).
//! The 128k-context variants' LongRoPE factors are not supported: they are
//! refused (`rope_factors_long.weight`).

use super::{Arch, ArchSpec, GgufKeys, Storage};
use crate::backend::RopePairing;
use crate::model::ModelError;
use crate::model::hf_config::HfConfig;

pub const PHI3: Arch = Arch {
    gguf: &["phi3"],
    hf: &["phi3"],
    gguf_pairing: RopePairing::RotateHalf,
    from_gguf,
    from_hf,
    hf_tensor,
};

fn spec() -> ArchSpec {
    ArchSpec {
        qkv_storage: Storage::Fused,
        gate_up_storage: Storage::Fused,
        ..ArchSpec::default()
    }
}

fn from_gguf(k: &GgufKeys) -> Result<ArchSpec, ModelError> {
    if k.has_tensor("rope_factors_long.weight") {
        return Err(long_rope());
    }
    Ok(spec())
}

fn from_hf(j: &HfConfig) -> Result<ArchSpec, ModelError> {
    if j.rope_scaling.is_some() {
        return Err(long_rope());
    }
    Ok(spec())
}

fn long_rope() -> ModelError {
    ModelError::Config(
        "this Phi-3 uses LongRoPE scaling (a 128k-context variant), which wllm does not support yet; \
         use a 4k-context Phi-3 / 3.5 file"
            .into(),
    )
}

fn hf_tensor(tail: &str) -> Option<&'static str> {
    Some(match tail {
        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
        "ffn_up.weight" => "mlp.gate_up_proj.weight",
        _ => return None,
    })
}
