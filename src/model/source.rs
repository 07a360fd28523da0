//! Where a model's tensors, config and tokenizer come from: one GGUF file or a
//! Hugging Face directory. Tensors are named with GGUF's names throughout.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::arch::Arch;
use super::gguf::GgufFile;
use super::safetensors::SafetensorsDir;
use super::{ModelConfig, ModelError};
use crate::quant::WeightFormat;
use crate::quant::mix::{Mix, ModelShape, TensorShape, plan};

/// A tensor as stored: `rows` x `cols` (cols contiguous; 1-D tensors have rows = 1).
pub struct RawTensor<'a> {
    pub name: String,
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// Borrowed from the file, or owned when quantised at load.
    pub bytes: Cow<'a, [u8]>,
}

/// Tensors re-quantised at load (`--quantize`): the type each one gets.
pub type Requant = HashMap<String, WeightFormat>;

/// An opened model.
pub enum ModelFiles {
    Gguf {
        path: PathBuf,
        file: GgufFile,
        requant: Option<Requant>,
    },
    Hf {
        dir: PathBuf,
        st: SafetensorsDir,
        requant: Option<Requant>,
        /// The family's own tensor names (config.json's model_type), where known.
        arch: Option<&'static Arch>,
    },
}

/// The Hugging Face name of a tensor named the GGUF way in a model of family
/// `arch` (Llama's names where the family has none of its own).
pub fn hf_tensor_name_for(arch: Option<&Arch>, gguf: &str) -> Option<String> {
    if let Some((layer, tail)) = gguf.strip_prefix("blk.").and_then(|r| r.split_once('.'))
        && let Some(part) = arch.and_then(|a| (a.hf_tensor)(tail))
    {
        return Some(format!("model.layers.{layer}.{part}"));
    }
    hf_tensor_name(gguf)
}

/// The Hugging Face name of a Llama tensor named the GGUF way, if it is one.
pub fn hf_tensor_name(gguf: &str) -> Option<String> {
    let fixed = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    if let Some((_, h)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return Some(h.to_string());
    }
    let (layer, tail) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let part = match tail {
        "attn_norm.weight" => "input_layernorm",
        "attn_q.weight" => "self_attn.q_proj",
        "attn_k.weight" => "self_attn.k_proj",
        "attn_v.weight" => "self_attn.v_proj",
        "attn_output.weight" => "self_attn.o_proj",
        "ffn_norm.weight" => "post_attention_layernorm",
        "ffn_gate.weight" => "mlp.gate_proj",
        "ffn_up.weight" => "mlp.up_proj",
        "ffn_down.weight" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{part}.weight"))
}

fn hf_name(arch: Option<&Arch>, gguf: &str) -> String {
    hf_tensor_name_for(arch, gguf).unwrap_or_else(|| gguf.to_string())
}

/// config.json's `model_type` family, if wllm knows it.
fn hf_arch(dir: &Path) -> Option<&'static Arch> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let a: super::hf_config::HfArch = serde_json::from_str(&text).ok()?;
    super::arch::by_hf(&a.model_type)
}

impl ModelFiles {
    /// Opens a `.gguf` file or a Hugging Face directory.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            if !path.join("config.json").exists() {
                return Err(ModelError::UnknownFormat(path.to_path_buf()));
            }
            Ok(Self::Hf {
                dir: path.to_path_buf(),
                st: SafetensorsDir::open(path)?,
                requant: None,
                arch: hf_arch(path),
            })
        } else if path.exists() {
            Ok(Self::Gguf {
                path: path.to_path_buf(),
                file: GgufFile::open(path)?,
                requant: None,
            })
        } else {
            Err(ModelError::Io(
                path.display().to_string(),
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ))
        }
    }

    pub fn config(&self) -> Result<ModelConfig, ModelError> {
        match self {
            Self::Gguf { file, .. } => ModelConfig::from_gguf(file),
            Self::Hf { dir, .. } => {
                let p = dir.join("config.json");
                let text = std::fs::read_to_string(&p).map_err(|e| ModelError::Io(p.display().to_string(), e))?;
                ModelConfig::from_hf_json(&text)
            }
        }
    }

    pub fn has(&self, name: &str) -> bool {
        match self {
            Self::Gguf { file, .. } => file.tensors.contains_key(name),
            Self::Hf { st, arch, .. } => st.tensors.contains_key(&hf_name(*arch, name)),
        }
    }

    /// Opens `path`, quantised at load to `mix` when one is given.
    pub fn open_with(path: &Path, mix: Option<Mix>) -> Result<Self, ModelError> {
        let files = Self::open(path)?;
        match mix {
            Some(m) => files.quantize_at_load(m),
            None => Ok(files),
        }
    }

    /// Quantises the Llama weights at load to `mix`, with llama-quantize's
    /// per-tensor rules (`quant::mix::plan`); `tensor` then returns them so.
    pub fn quantize_at_load(mut self, mix: Mix) -> Result<Self, ModelError> {
        let cfg = self.config()?;
        let mut names = vec!["token_embd.weight".to_string(), "output.weight".into()];
        for l in 0..cfg.layers {
            for t in [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_qkv",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            ] {
                names.push(format!("blk.{l}.{t}.weight"));
            }
        }
        let mut dims = Vec::new();
        for n in names.iter().filter(|n| self.has(n)) {
            let t = self.stored_tensor(n)?;
            dims.push((n.clone(), [t.cols as u64, t.rows as u64]));
        }
        let shapes: Vec<TensorShape> = dims.iter().map(|(name, d)| TensorShape { name, dims: d }).collect();
        let model = ModelShape {
            n_layer: cfg.layers,
            n_gqa: cfg.heads / cfg.kv_heads.max(1),
        };
        let map: Requant = dims
            .iter()
            .zip(plan(mix, &model, &shapes))
            .filter_map(|((n, _), f)| Some((n.clone(), f?)))
            .collect();
        match &mut self {
            Self::Gguf { requant, .. } | Self::Hf { requant, .. } => *requant = Some(map),
        }
        Ok(self)
    }

    /// The tensor named `name` (GGUF naming), quantised when `quantize_at_load` says so.
    pub fn tensor(&self, name: &str) -> Result<RawTensor<'_>, ModelError> {
        let t = self.stored_tensor(name)?;
        let (Self::Gguf { requant, .. } | Self::Hf { requant, .. }) = self;
        match requant.as_ref().and_then(|r| r.get(name)) {
            Some(&to) if to != t.format => {
                let tensor_err = |source| ModelError::Tensor {
                    name: name.to_string(),
                    source,
                };
                let x = crate::quant::dequantize(t.format, &t.bytes, t.rows, t.cols).map_err(tensor_err)?;
                let q = crate::quant::quantize::quantize_parallel(to, &x, t.rows, t.cols).map_err(tensor_err)?;
                Ok(RawTensor {
                    format: to,
                    bytes: Cow::Owned(q),
                    ..t
                })
            }
            _ => Ok(t),
        }
    }

    /// The tensor named `name` as stored.
    pub fn stored_tensor(&self, name: &str) -> Result<RawTensor<'_>, ModelError> {
        match self {
            Self::Gguf { file, .. } => {
                let t = file
                    .tensors
                    .get(name)
                    .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
                let format = WeightFormat::from_ggml_type(t.ggml_type).ok_or_else(|| ModelError::UnsupportedType {
                    name: name.into(),
                    ty: ggml_type_name(t.ggml_type),
                })?;
                let cols = t.dims[0] as usize;
                let rows = t.dims[1..].iter().product::<u64>() as usize;
                Ok(RawTensor {
                    name: name.into(),
                    format,
                    rows,
                    cols,
                    bytes: Cow::Borrowed(file.bytes(t)),
                })
            }
            Self::Hf { st, arch, .. } => {
                let hn = hf_name(*arch, name);
                let t = st.tensors.get(&hn).ok_or(ModelError::MissingTensor(hn.clone()))?;
                let cols = t.shape.last().copied().unwrap_or(1);
                let rows = t.shape.iter().rev().skip(1).product::<usize>();
                Ok(RawTensor {
                    name: hn,
                    format: t.format,
                    rows,
                    cols,
                    bytes: Cow::Borrowed(st.bytes(t)),
                })
            }
        }
    }

    /// Every tensor as it will load: its type (after `--quantize`), rows and
    /// columns, without reading its bytes (the memory plan's weight count).
    pub fn tensor_shapes(&self) -> Vec<(WeightFormat, usize, usize)> {
        let lookup = |r: &Option<Requant>, name: &str| r.as_ref().and_then(|r| r.get(name)).copied();
        match self {
            Self::Gguf { file, requant, .. } => file
                .tensors
                .iter()
                .filter_map(|(name, t)| {
                    let format = WeightFormat::from_ggml_type(t.ggml_type)?;
                    let cols = t.dims.first().copied().unwrap_or(1) as usize;
                    let rows = t.dims.iter().skip(1).product::<u64>() as usize;
                    Some((lookup(requant, name).unwrap_or(format), rows, cols))
                })
                .collect(),
            Self::Hf { st, requant, arch, .. } => {
                let by_hf: HashMap<String, WeightFormat> = requant
                    .iter()
                    .flatten()
                    .map(|(gguf, &f)| (hf_name(*arch, gguf), f))
                    .collect();
                st.tensors
                    .iter()
                    .map(|(name, t)| {
                        let cols = t.shape.last().copied().unwrap_or(1);
                        let rows = t.shape.iter().rev().skip(1).product::<usize>();
                        (by_hf.get(name).copied().unwrap_or(t.format), rows, cols)
                    })
                    .collect()
            }
        }
    }

    /// Where this model was opened from.
    pub fn path(&self) -> &Path {
        match self {
            Self::Gguf { path, .. } => path,
            Self::Hf { dir, .. } => dir,
        }
    }
}

/// ggml's name of a type id, for error messages.
pub fn ggml_type_name(t: u32) -> String {
    let names = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
        "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16",
        "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    names
        .get(t as usize)
        .map_or(format!("ggml type {t}"), |s| s.to_string())
}
