//! llama.cpp's quantisation mixes (`llama-quantize`'s `Q4_K_M`, `Q3_K_S`, …):
//! which type each tensor gets, following `llama_tensor_get_type` of
//! llama.cpp's `src/llama-quant.cpp` for dense models without an importance
//! matrix — the output (or tied token embedding) at Q6_K, more bits for
//! `attn_v` and `ffn_down` in the layers `use_more_bits` picks, and the
//! fallback when a row length is not a multiple of the type's block
//! (Q4_K→Q5_0, Q5_K→Q5_1, Q6_K→Q8_0, Q2_K/Q3_K→Q4_0, then F16).

use super::WeightFormat;

/// A quantisation mix by llama.cpp's name.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mix {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
}

impl Mix {
    pub const ALL: [Mix; 17] = [
        Mix::F32,
        Mix::F16,
        Mix::BF16,
        Mix::Q8_0,
        Mix::Q4_0,
        Mix::Q4_1,
        Mix::Q5_0,
        Mix::Q5_1,
        Mix::Q2_K,
        Mix::Q3_K_S,
        Mix::Q3_K_M,
        Mix::Q3_K_L,
        Mix::Q4_K_S,
        Mix::Q4_K_M,
        Mix::Q5_K_S,
        Mix::Q5_K_M,
        Mix::Q6_K,
    ];

    pub fn name(self) -> String {
        format!("{self:?}")
    }

    /// The mix named `s` (case-insensitive); the bare K-quant names mean their
    /// `_M` mix as in llama-quantize (`Q4_K` = `Q4_K_M`, `Q3_K` = `Q3_K_M`,
    /// `Q5_K` = `Q5_K_M`).
    pub fn from_name(s: &str) -> Option<Mix> {
        let s = s.to_ascii_uppercase();
        let s = match s.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            o => o,
        };
        Mix::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The type of every tensor the mix does not single out.
    pub fn base(self) -> WeightFormat {
        use WeightFormat as F;
        match self {
            Mix::F32 => F::F32,
            Mix::F16 => F::F16,
            Mix::BF16 => F::Bf16,
            Mix::Q8_0 => F::Q8_0,
            Mix::Q4_0 => F::Q4_0,
            Mix::Q4_1 => F::Q4_1,
            Mix::Q5_0 => F::Q5_0,
            Mix::Q5_1 => F::Q5_1,
            Mix::Q2_K => F::Q2_K,
            Mix::Q3_K_S | Mix::Q3_K_M | Mix::Q3_K_L => F::Q3_K,
            Mix::Q4_K_S | Mix::Q4_K_M => F::Q4_K,
            Mix::Q5_K_S | Mix::Q5_K_M => F::Q5_K,
            Mix::Q6_K => F::Q6_K,
        }
    }

    /// llama.cpp's `llama_ftype` id, stored as `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            Mix::F32 => 0,
            Mix::F16 => 1,
            Mix::Q4_0 => 2,
            Mix::Q4_1 => 3,
            Mix::Q8_0 => 7,
            Mix::Q5_0 => 8,
            Mix::Q5_1 => 9,
            Mix::Q2_K => 10,
            Mix::Q3_K_S => 11,
            Mix::Q3_K_M => 12,
            Mix::Q3_K_L => 13,
            Mix::Q4_K_S => 14,
            Mix::Q4_K_M => 15,
            Mix::Q5_K_S => 16,
            Mix::Q5_K_M => 17,
            Mix::Q6_K => 18,
            Mix::BF16 => 32,
        }
    }
}

impl std::str::FromStr for Mix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mix::from_name(s).ok_or_else(|| {
            let names: Vec<String> = Mix::ALL.iter().map(|m| m.name()).collect();
            format!("unknown quantisation type {s:?}; use one of {}", names.join(", "))
        })
    }
}

/// A tensor as the planner sees it (GGUF naming; `dims[0]` is the row length).
pub struct TensorShape<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
}

/// The model facts the rules depend on.
pub struct ModelShape {
    pub n_layer: usize,
    /// Query heads per KV head.
    pub n_gqa: usize,
}

/// Whether llama.cpp quantises this tensor at all (2-D weights but norms).
pub fn is_quantizable(t: &TensorShape) -> bool {
    t.name.ends_with("weight") && t.dims.len() >= 2 && !t.name.ends_with("_norm.weight")
}

fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64).rem_euclid(3) == 2
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type of each tensor, in order (None: kept as stored). The layer of
/// `attn_v` and `ffn_down` is the one in its name (llama.cpp counts them in
/// layer order, which is not the file order of GGUFs sorted by name).
pub fn plan(mix: Mix, model: &ModelShape, tensors: &[TensorShape]) -> Vec<Option<WeightFormat>> {
    use WeightFormat as F;
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    let n_attn_v = tensors.iter().filter(|t| t.name.contains("attn_v.weight")).count();
    let mut i_attn_v = 0;
    let base = mix.base();
    tensors
        .iter()
        .map(|t| {
            if !is_quantizable(t) {
                return None;
            }
            if !base.is_quantized() {
                return Some(base);
            }
            let cols = t.dims[0] as usize;
            let n = model.n_layer;
            let mut ty = base;
            if t.name == "output.weight" || (tied && t.name == "token_embd.weight") {
                if !cols.is_multiple_of(base.block().0) {
                    ty = F::Q8_0;
                } else if base != F::Q8_0 {
                    ty = F::Q6_K;
                }
            } else if t.name == "token_embd.weight" {
                // Kept at the base type.
            } else if t.name.contains("attn_v.weight") {
                let i = layer_of(t.name).unwrap_or(i_attn_v);
                ty = match mix {
                    Mix::Q2_K if model.n_gqa >= 4 => F::Q4_K,
                    Mix::Q2_K => F::Q3_K,
                    Mix::Q3_K_M if i < 2 => F::Q5_K,
                    Mix::Q3_K_M => F::Q4_K,
                    Mix::Q3_K_L => F::Q5_K,
                    Mix::Q4_K_M | Mix::Q5_K_M if use_more_bits(i, n_attn_v) => F::Q6_K,
                    Mix::Q4_K_S if i < 4 => F::Q5_K,
                    _ => base,
                };
                i_attn_v += 1;
            } else if t.name.contains("ffn_down") {
                let i = layer_of(t.name).unwrap_or(0);
                ty = match mix {
                    Mix::Q2_K => F::Q3_K,
                    Mix::Q3_K_M if i < n / 16 => F::Q5_K,
                    Mix::Q3_K_M => F::Q4_K,
                    Mix::Q3_K_L => F::Q5_K,
                    Mix::Q4_K_M | Mix::Q5_K_M if use_more_bits(i, n) => F::Q6_K,
                    Mix::Q4_K_S if i < n / 8 => F::Q5_K,
                    _ => base,
                };
            } else if t.name.contains("attn_output.weight") {
                ty = match mix {
                    Mix::Q2_K => F::Q3_K,
                    Mix::Q3_K_M => F::Q4_K,
                    Mix::Q3_K_L => F::Q5_K,
                    _ => base,
                };
            }
            Some(fallback(ty, cols))
        })
        .collect()
}

/// llama.cpp's fallback for a row length that is no whole number of blocks.
pub fn fallback(ty: WeightFormat, cols: usize) -> WeightFormat {
    use WeightFormat as F;
    if cols.is_multiple_of(ty.block().0) {
        return ty;
    }
    let f = match ty {
        F::Q2_K | F::Q3_K => F::Q4_0,
        F::Q4_K => F::Q5_0,
        F::Q5_K => F::Q5_1,
        F::Q6_K => F::Q8_0,
        F::IQ4_XS => F::IQ4_NL,
        other => other,
    };
    if cols.is_multiple_of(f.block().0) { f } else { F::F16 }
}
