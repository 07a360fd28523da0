//! The architecture layer: what sets one decoder family apart from another,
//! read once at load. Each family has one small file here: its GGUF and
//! Hugging Face keys → an `ArchSpec`, its Hugging Face tensor names, and its
//! rope pairing. The forward pass (`model::decoder`) runs every family from
//! its spec, and `model::fusion` decides once, at load, which of the layer's
//! ops run fused on the backend.

pub mod gemma;
pub mod llama;
pub mod phi3;
pub mod qwen;

use super::ModelError;
use super::gguf::{GgufFile, Value};
use super::hf_config::HfConfig;
use crate::backend::{Activation, RopePairing};

/// How a pair of projections is stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// One tensor each (`attn_q`, `attn_k`, `attn_v`; `ffn_gate`, `ffn_up`).
    Split,
    /// One tensor with the rows of each after the other (Phi-3's `attn_qkv`,
    /// and its `ffn_up` holding gate then up).
    Fused,
}

/// What a decoder family does beyond the Llama layer.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchSpec {
    /// Biases on q, k and v (`attn_q.bias`, …; Qwen 2).
    pub qkv_bias: bool,
    /// RMSNorm of each q and k head before rope (`attn_q_norm`, `attn_k_norm`; Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorms of the attention and MLP outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`; Gemma 2 and 3).
    pub post_norms: bool,
    /// The embeddings are multiplied by this (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// The gated MLP's activation.
    pub act: Activation,
    /// The attention score scale (None: 1/√head_dim).
    pub attn_scale: Option<f32>,
    /// Attention scores become c·tanh(s/c) (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become c·tanh(x/c) (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Added to every RMSNorm weight at load (a Hugging Face Gemma stores w
    /// and applies 1 + w; GGUF files hold 1 + w already).
    pub norm_offset: f32,
    pub qkv_storage: Storage,
    pub gate_up_storage: Storage,
    /// The sliding window of the layers that have one.
    pub sliding_window: Option<usize>,
    /// Which layers attend through the window (empty: none).
    pub swa_layers: Vec<bool>,
    /// The rope base of the windowed layers where it differs (Gemma 3: 10 000 against 1 000 000).
    pub rope_theta_swa: Option<f64>,
}

impl Default for ArchSpec {
    /// The Llama layer.
    fn default() -> Self {
        Self {
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            act: Activation::Silu,
            attn_scale: None,
            attn_softcap: None,
            final_softcap: None,
            norm_offset: 0.0,
            qkv_storage: Storage::Split,
            gate_up_storage: Storage::Split,
            sliding_window: None,
            swa_layers: Vec::new(),
            rope_theta_swa: None,
        }
    }
}

impl ArchSpec {
    /// Layer `l`'s sliding window (None: it attends to the whole context).
    pub fn window(&self, l: usize) -> Option<usize> {
        match self.swa_layers.get(l) {
            Some(true) => self.sliding_window,
            _ => None,
        }
    }

    /// Marks layers as windowed by llama.cpp's pattern rule: with pattern n,
    /// layer l is windowed when l % n < n - 1 (n = 1: every layer).
    pub fn set_swa_pattern(&mut self, layers: usize, pattern: usize) {
        self.swa_layers = (0..layers).map(|l| pattern <= 1 || l % pattern < pattern - 1).collect();
    }
}

/// One family: the names it goes by and how its spec is read.
pub struct Arch {
    /// `general.architecture` values.
    pub gguf: &'static [&'static str],
    /// config.json `model_type` values.
    pub hf: &'static [&'static str],
    /// Rotary pairs in GGUF files: llama.cpp's converter permutes Llama's q/k
    /// rows to adjacent pairs; the NEOX families keep rotate-half.
    pub gguf_pairing: RopePairing,
    pub from_gguf: fn(&GgufKeys) -> Result<ArchSpec, ModelError>,
    pub from_hf: fn(&HfConfig) -> Result<ArchSpec, ModelError>,
    /// The Hugging Face name of a layer tensor's GGUF tail (`attn_q.weight`),
    /// where the family differs from Llama's names.
    pub hf_tensor: fn(&str) -> Option<&'static str>,
}

/// Every family wllm runs.
pub const ARCHS: [&Arch; 6] = [
    &llama::LLAMA,
    &qwen::QWEN2,
    &qwen::QWEN3,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &phi3::PHI3,
];

/// The family of a GGUF `general.architecture`.
pub fn by_gguf(name: &str) -> Option<&'static Arch> {
    ARCHS.into_iter().find(|a| a.gguf.contains(&name))
}

/// The family of a config.json `model_type`.
pub fn by_hf(name: &str) -> Option<&'static Arch> {
    ARCHS.into_iter().find(|a| a.hf.contains(&name))
}

/// The names wllm runs, for error messages.
pub fn supported() -> String {
    ARCHS
        .iter()
        .flat_map(|a| a.gguf.iter())
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// A GGUF file's `{arch}.*` keys.
pub struct GgufKeys<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl GgufKeys<'_> {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.file.get(&format!("{}.{key}", self.arch))
    }
    pub fn u(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(Value::as_u64).map(|v| v as usize)
    }
    pub fn f(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    pub fn has_tensor(&self, name: &str) -> bool {
        self.file.tensors.contains_key(name)
    }
}
