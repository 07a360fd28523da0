//! Which of a layer's ops run fused, decided once, at load, in one place: from
//! what the backend fuses and what the family's layer has between the ops.
//! A fused kernel gives the same bits as the unfused chain it replaces, so
//! falling back is always safe; it only costs launches.
//!
//! - `qkv_rope`: q, k, v gemm + rope + cache write as one op (`gemm_rope_kv`),
//!   not where biases or q/k head norms come between the gemm and rope;
//! - `gate_up_act`: gate, up gemm + silu·mul as one op (`gemm_silu_mul`), for
//!   a silu MLP (the fused epilogue is silu's);
//! - `norms`: the layer's RMSNorms taken by the gemms (`NormArgs`) and the
//!   residual adds by `gemm_residual`, only where both fusions above hold and
//!   no norm comes after a sublayer (Gemma's post-norms).
//!
//! The weights are laid out at load for the plan (q/k rows paired for
//! `qkv_rope`, gate/up interleaved for `gate_up_act`); a layer whose matrices
//! differ in format cannot be stacked, and then the plan drops the fusion for
//! the whole model (`Fusion::settle`).

use super::ModelConfig;
use crate::backend::{Activation, Backend, FusedOps};

/// What runs fused in every layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fusion {
    pub qkv_rope: bool,
    pub gate_up_act: bool,
    pub norms: bool,
}

impl Fusion {
    /// The plan for `cfg`'s family on backend `ks`, before the weights are seen.
    pub fn decide<B: Backend>(ks: &B, cfg: &ModelConfig) -> Self {
        let s = &cfg.spec;
        let Some(f) = ks.fused() else {
            return Self::default();
        };
        let qkv_rope = f.fuses_qkv_rope() && !s.qkv_bias && !s.qk_norm;
        let gate_up_act = f.fuses_gate_up() && s.act == Activation::Silu;
        Self {
            qkv_rope,
            gate_up_act,
            norms: qkv_rope && gate_up_act && !s.post_norms && f.fuses_norm(cfg.hidden as u32),
        }
    }

    /// The plan once every layer is loaded: the norms stay fused only where
    /// every layer got its fused q/k/v and gate/up weights.
    pub fn settle(self, layers_fused: bool) -> Self {
        Self {
            norms: self.norms && layers_fused,
            ..self
        }
    }
}
