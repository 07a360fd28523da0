//! A Hugging Face `config.json`, as a typed struct: the
//! fields wllm reads, with serde naming what is missing or mistyped.

use serde::Deserialize;

/// The fields of config.json the engine uses (others are ignored).
#[derive(Clone, Debug, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Default: num_attention_heads (no GQA).
    pub num_key_value_heads: Option<usize>,
    /// Default: hidden_size / num_attention_heads.
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    /// Default 1e-5.
    pub rms_norm_eps: Option<f64>,
    /// Default 10000.
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<RopeScaling>,
    /// Default 2048.
    pub max_position_embeddings: Option<usize>,
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Qwen 3: biases on q, k, v.
    pub attention_bias: Option<bool>,
    /// Gemma: the attention score scale is 1/√query_pre_attn_scalar.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2's soft-caps.
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 3: which layers are windowed ("sliding_attention" / "full_attention"),
    /// or the pattern (every n-th layer global).
    pub layer_types: Option<Vec<String>>,
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: the windowed layers' rope base.
    pub rope_local_base_freq: Option<f64>,
}

/// `rope_scaling` (only Llama 3's kind is supported).
#[derive(Clone, Debug, Deserialize)]
pub struct RopeScaling {
    pub rope_type: Option<String>,
    /// The older spelling of `rope_type`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
}

/// Just the architecture, read first so that another model family gets its
/// own error rather than one about a missing field.
#[derive(Deserialize)]
pub struct HfArch {
    #[serde(default)]
    pub model_type: String,
}

#[cfg(test)]
mod tests {
    use crate::model::{ModelConfig, ModelError};

    const BASE: &str = r#""model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100"#;

    #[test]
    fn defaults_and_nulls() {
        let c = ModelConfig::from_hf_json(&format!(
            r#"{{{BASE}, "head_dim": null, "rope_scaling": null, "sliding_window": null}}"#
        ))
        .unwrap();
        assert_eq!((c.kv_heads, c.head_dim, c.max_context), (4, 16, 2048));
        assert!(!c.tie_embeddings);
        assert!(c.rope_freq_factors.is_none());
    }

    #[test]
    fn a_missing_or_mistyped_field_is_named() {
        let e = ModelConfig::from_hf_json(r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
        let e = ModelConfig::from_hf_json(&format!(r#"{{{BASE}, "rms_norm_eps": "small"}}"#)).unwrap_err();
        assert!(
            e.to_string().contains("rms_norm_eps") || e.to_string().contains("invalid type"),
            "{e}"
        );
    }

    #[test]
    fn another_family_is_refused_before_its_fields_are_read() {
        match ModelConfig::from_hf_json(r#"{"model_type": "gpt2"}"#) {
            Err(ModelError::UnsupportedArch(a)) => assert_eq!(a, "gpt2"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sliding_window_windows_every_layer_and_keeps_the_context() {
        let c = ModelConfig::from_hf_json(&format!(
            r#"{{{BASE}, "max_position_embeddings": 8192, "sliding_window": 4096}}"#
        ))
        .unwrap();
        assert_eq!(c.max_context, 8192);
        assert_eq!((c.spec.window(0), c.spec.window(1)), (Some(4096), Some(4096)));
    }

    #[test]
    fn gemma3_layers_follow_their_types() {
        let c = ModelConfig::from_hf_json(
            r#"{"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 2, "head_dim": 32, "intermediate_size": 128, "vocab_size": 100,
            "sliding_window": 16, "query_pre_attn_scalar": 64,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}"#,
        )
        .unwrap();
        assert_eq!(
            (c.spec.window(0), c.spec.window(1), c.spec.window(2)),
            (Some(16), None, Some(16))
        );
        assert_eq!(c.spec.attn_scale, Some(0.125));
        assert_eq!(c.spec.norm_offset, 1.0);
        assert_eq!(c.spec.rope_theta_swa, Some(10_000.0));
    }
}
