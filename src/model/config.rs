//! A model's shape and constants, from GGUF metadata or a Hugging Face
//! config.json; what its family adds to the Llama layer is in `spec`
//! (`model::arch`).

use super::ModelError;
use super::arch::{self, ArchSpec, GgufKeys};
use super::gguf::GgufFile;
use super::hf_config::{HfArch, HfConfig, RopeScaling};
use crate::backend::RopePairing;

/// Shape and constants of a decoder-only model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: String,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    /// Per-frequency divisors (Llama 3 style scaling), `head_dim / 2` of them.
    pub rope_freq_factors: Option<Vec<f64>>,
    pub rope_pairing: RopePairing,
    pub max_context: usize,
    pub tie_embeddings: bool,
    /// What the family does beyond the Llama layer.
    pub spec: ArchSpec,
    /// The embedding pooling the file names (`{arch}.pooling_type`), if any.
    pub pooling: Option<crate::config::Pooling>,
}

impl ModelConfig {
    /// Reads `{arch}.*` keys of a GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch = g
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let family = arch::by_gguf(&arch).ok_or_else(|| ModelError::UnsupportedArch(arch.clone()))?;
        let u = |k: &str| -> Result<usize, ModelError> {
            g.get(&format!("{arch}.{k}"))
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Config(format!("GGUF metadata lacks {arch}.{k}")))
        };
        let hidden = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let layers = u("block_count")?;
        // Before anything is sized from them (the family's per-layer tables, the KV groups).
        check_bounds(&[
            (&format!("{arch}.embedding_length"), hidden, MAX_HIDDEN),
            (&format!("{arch}.attention.head_count"), heads, MAX_HEADS),
            (&format!("{arch}.block_count"), layers, MAX_LAYERS),
        ])?;
        check_blocks_present(g, layers)?;
        let vocab = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => g.get("tokenizer.ggml.tokens").and_then(|v| v.array_len()).unwrap_or(0),
        };
        let head_dim = head_dim_of(g, &arch, hidden, heads);
        if let Ok(rot) = u("rope.dimension_count")
            && rot != head_dim
        {
            return Err(ModelError::Config(format!(
                "rope over {rot} of each head's {head_dim} dimensions (partial rotary) is not supported"
            )));
        }
        let keys = GgufKeys {
            file: g,
            arch: &arch,
            layers,
            hidden,
            heads,
            head_dim,
        };
        let spec = (family.from_gguf)(&keys)?;
        let cfg = Self {
            hidden,
            layers,
            heads,
            kv_heads: u("attention.head_count_kv").unwrap_or(heads),
            head_dim,
            intermediate: u("feed_forward_length")?,
            vocab,
            rms_eps: g
                .get(&format!("{arch}.attention.layer_norm_rms_epsilon"))
                .and_then(|v| v.as_f64())
                .unwrap_or(1e-5) as f32,
            rope_theta: g
                .get(&format!("{arch}.rope.freq_base"))
                .and_then(|v| v.as_f64())
                .unwrap_or(10000.0),
            rope_freq_factors: gguf_rope_freqs(g, head_dim)?,
            rope_pairing: family.gguf_pairing,
            max_context: u("context_length").unwrap_or(2048),
            tie_embeddings: !g.tensors.contains_key("output.weight"),
            pooling: u("pooling_type")
                .ok()
                .and_then(|v| crate::config::Pooling::from_gguf(v as u64)),
            arch,
            spec,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a Hugging Face config.json. A `sliding_window` windows the layers
    /// the family says (it does not cap the context).
    pub fn from_hf_json(text: &str) -> Result<Self, ModelError> {
        let bad_json = |e: serde_json::Error| ModelError::Config(format!("config.json: {e}"));
        let arch: HfArch = serde_json::from_str(text).map_err(bad_json)?;
        let Some(family) = arch::by_hf(&arch.model_type) else {
            return Err(ModelError::UnsupportedArch(arch.model_type));
        };
        let j: HfConfig = serde_json::from_str(text).map_err(bad_json)?;
        check_bounds(&[
            ("config.json hidden_size", j.hidden_size, MAX_HIDDEN),
            ("config.json num_attention_heads", j.num_attention_heads, MAX_HEADS),
            ("config.json num_hidden_layers", j.num_hidden_layers, MAX_LAYERS),
        ])?;
        let heads = j.num_attention_heads;
        let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
        let rope_theta = j.rope_theta.unwrap_or(10000.0);
        let spec = (family.from_hf)(&j)?;
        let rope_freq_factors = match &j.rope_scaling {
            None => None,
            Some(s) => Some(llama3_factors(s, head_dim, rope_theta)?),
        };
        let cfg = Self {
            hidden: j.hidden_size,
            layers: j.num_hidden_layers,
            heads,
            kv_heads: j.num_key_value_heads.unwrap_or(heads),
            head_dim,
            intermediate: j.intermediate_size,
            vocab: j.vocab_size,
            rms_eps: j.rms_norm_eps.unwrap_or(1e-5) as f32,
            rope_theta,
            rope_freq_factors,
            rope_pairing: RopePairing::RotateHalf,
            max_context: j.max_position_embeddings.unwrap_or(2048),
            tie_embeddings: j.tie_word_embeddings,
            pooling: None,
            arch: j.model_type,
            spec,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        check_bounds(&[
            ("hidden size", self.hidden, MAX_HIDDEN),
            ("layer count", self.layers, MAX_LAYERS),
            ("head count", self.heads, MAX_HEADS),
            ("KV head count", self.kv_heads, MAX_HEADS),
            ("feed-forward size", self.intermediate, MAX_INTERMEDIATE),
            ("vocabulary size", self.vocab, MAX_VOCAB),
            ("context length", self.max_context, MAX_CONTEXT),
        ])?;
        if [
            self.hidden,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.intermediate,
            self.vocab,
        ]
        .contains(&0)
        {
            return bad(format!("a dimension is zero: {self:?}"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(4) || self.head_dim > 256 {
            return bad(format!(
                "head_dim {} must be a multiple of 4 and at most 256",
                self.head_dim
            ));
        }
        if self.spec.sliding_window.is_some_and(|w| w > u32::MAX as usize) {
            return bad("the sliding window does not fit 32 bits".into());
        }
        Ok(())
    }

    /// KV-cache bytes per token: 2 · L · H_kv · d_h · b, b the element's bytes
    /// (4 for f32, 2 for f16).
    pub fn kv_bytes_per_token(&self, dtype: crate::config::KvDtype) -> usize {
        2 * self.layers * dtype.row_bytes((self.kv_heads * self.head_dim) as u64) as usize
    }

    /// Width of the fused q|k|v row.
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Layer `l`'s rope base.
    pub fn rope_theta_of(&self, l: usize) -> f64 {
        match (self.spec.window(l), self.spec.rope_theta_swa) {
            (Some(_), Some(t)) => t,
            _ => self.rope_theta,
        }
    }
}

/// Bounds on a model's hyper-parameters, checked before anything is sized
/// from them: a file claiming more is refused as corrupt, never allocated
/// for (the largest published models are well inside each).
pub const MAX_LAYERS: usize = 1024;
pub const MAX_HIDDEN: usize = 1 << 20;
pub const MAX_HEADS: usize = 4096;
pub const MAX_INTERMEDIATE: usize = 1 << 22;
pub const MAX_VOCAB: usize = 1 << 22;
pub const MAX_CONTEXT: usize = 1 << 24;

fn check_bounds(values: &[(&str, usize, usize)]) -> Result<(), ModelError> {
    match values.iter().find(|(_, v, max)| v > max) {
        Some((name, v, max)) => Err(ModelError::Config(format!(
            "{name} is {v}, more than the {max} wllm accepts: the file is corrupt or not a model wllm runs"
        ))),
        None => Ok(()),
    }
}

/// A GGUF's `block_count` agrees with its `blk.N.*` tensors (where it has any:
/// a file of metadata only is read by `wllm info`).
fn check_blocks_present(g: &GgufFile, layers: usize) -> Result<(), ModelError> {
    let blocks = g
        .tensors
        .keys()
        .filter_map(|n| n.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok())
        .max()
        .map(|b| b + 1);
    match blocks {
        Some(b) if b != layers => Err(ModelError::Config(format!(
            "the file says it has {layers} layers (block_count) but holds tensors of {b}: the file is corrupt"
        ))),
        _ => Ok(()),
    }
}

fn head_dim_of(g: &GgufFile, arch: &str, hidden: usize, heads: usize) -> usize {
    let u = |k: &str| {
        g.get(&format!("{arch}.{k}"))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
    };
    u("attention.key_length")
        .or_else(|| u("rope.dimension_count"))
        .unwrap_or(hidden / heads.max(1))
}
/// GGUF's Llama 3 rope scaling: the `rope_freqs.weight` tensor, one divisor per frequency.
fn gguf_rope_freqs(g: &GgufFile, head_dim: usize) -> Result<Option<Vec<f64>>, ModelError> {
    let Some(t) = g.tensors.get("rope_freqs.weight") else {
        return Ok(None);
    };
    let bytes = g.bytes(t);
    if t.ggml_type != 0 || bytes.len() != head_dim / 2 * 4 {
        return Err(ModelError::Config(format!(
            "rope_freqs.weight must be {} f32 values (type {}, {} bytes found)",
            head_dim / 2,
            t.ggml_type,
            bytes.len()
        )));
    }
    Ok(Some(
        bytes
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
    ))
}

/// Llama 3 `rope_scaling`: a divisor per rotary frequency.
fn llama3_factors(s: &RopeScaling, head_dim: usize, theta: f64) -> Result<Vec<f64>, ModelError> {
    let kind = s.rope_type.as_deref().or(s.kind.as_deref()).unwrap_or("");
    if kind != "llama3" {
        return Err(ModelError::Config(format!(
            "rope_scaling type {kind:?} is not supported (only llama3)"
        )));
    }
    let (factor, low, high, orig) = (
        s.factor.unwrap_or(8.0),
        s.low_freq_factor.unwrap_or(1.0),
        s.high_freq_factor.unwrap_or(4.0),
        s.original_max_position_embeddings.unwrap_or(8192.0),
    );
    let (low_wl, high_wl) = (orig / low, orig / high);
    Ok((0..head_dim / 2)
        .map(|i| {
            let freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            if wl < high_wl {
                1.0
            } else if wl > low_wl {
                factor
            } else {
                let smooth = (orig / wl - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect())
}
