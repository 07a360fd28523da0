//! Llama and Mistral: the base layer (RMSNorm → q, k, v → rope → attention →
//! o → RMSNorm → silu(gate)·up → down, residual adds), no extras. A Mistral
//! `sliding_window` windows every layer (it does not cap the context).

use super::{Arch, ArchSpec, GgufKeys};
use crate::backend::RopePairing;
use crate::model::ModelError;
use crate::model::hf_config::HfConfig;

pub const LLAMA: Arch = Arch {
    gguf: &["llama", "mistral"],
    hf: &["llama", "mistral"],
    gguf_pairing: RopePairing::Adjacent,
    from_gguf,
    from_hf,
    hf_tensor: |_| None,
};

fn from_gguf(k: &GgufKeys) -> Result<ArchSpec, ModelError> {
    let mut s = ArchSpec::default();
    if let Some(w) = k.u("attention.sliding_window").filter(|&w| w > 0) {
        s.sliding_window = Some(w);
        s.set_swa_pattern(k.layers, 1);
    }
    Ok(s)
}

fn from_hf(j: &HfConfig) -> Result<ArchSpec, ModelError> {
    let mut s = ArchSpec::default();
    if let Some(w) = j.sliding_window.filter(|&w| w > 0) {
        s.sliding_window = Some(w);
        s.set_swa_pattern(j.num_hidden_layers, 1);
    }
    Ok(s)
}
