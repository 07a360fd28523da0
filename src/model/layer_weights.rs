//! A decoder layer's projection weights as the step reads them (as
//! `model::fusion` planned them): q, k and v
//! stacked into one matrix (one gemm fills the fused qkv row; where the
//! backend also fuses rope and the cache write into it, the q and k rows of
//! each rotated pair side by side), and gate and up
//! interleaved for a backend that fuses silu·mul into their gemm (else stacked,
//! one gemm then `silu_mul`). Stacking and interleaving only reorder rows, so
//! every output is reduced exactly as a gemm over its own matrix would: the
//! fusion changes no bit. Matrices that differ in format stay split.

use super::arch::Storage;
use super::{ModelError, ModelFiles, backend_err};
use crate::backend::{Backend, RopePairing, WeightInfo};
use crate::quant::{self, Repacked};

/// q, k, v: `[q; k; v]` as one matrix where their formats agree, for
/// `Backend::gemm_rope_kv` (`RopeFused`, rows paired by `pair_rope_rows`) or
/// for `gemm` then `rope_cache_write` (`Stacked`).
pub enum QkvWeights<W> {
    RopeFused(W),
    Stacked(W),
    Split { q: W, k: W, v: W },
}

/// gate, up: interleaved (gate i at row 2i, up i at 2i+1) for
/// `Backend::gemm_silu_mul`, stacked `[gate; up]` for `gemm` + `silu_mul`, or
/// split where their formats differ.
pub enum GateUpWeights<W> {
    Interleaved(W),
    Stacked(W),
    Split { gate: W, up: W },
}

impl<W: WeightInfo> QkvWeights<W> {
    pub fn weights(&self) -> Vec<&W> {
        match self {
            Self::RopeFused(w) | Self::Stacked(w) => vec![w],
            Self::Split { q, k, v } => vec![q, k, v],
        }
    }
}

impl<W: WeightInfo> GateUpWeights<W> {
    pub fn weights(&self) -> Vec<&W> {
        match self {
            Self::Interleaved(w) | Self::Stacked(w) => vec![w],
            Self::Split { gate, up } => vec![gate, up],
        }
    }
}

/// Reads and repacks `name`, checking its shape.
pub fn load_repacked(files: &ModelFiles, name: &str, rows: usize, cols: usize) -> Result<Repacked, ModelError> {
    let t = files.tensor(name)?;
    if t.rows != rows || t.cols != cols {
        return Err(ModelError::Shape {
            name: t.name.clone(),
            got: vec![t.rows, t.cols],
            want: vec![rows, cols],
        });
    }
    quant::repack(t.format, &t.bytes, rows, cols).map_err(|source| ModelError::Tensor {
        name: t.name.clone(),
        source,
    })
}

fn upload<B: Backend>(ks: &B, r: &Repacked, label: &str) -> Result<B::Weight, ModelError> {
    ks.upload_weight(r, label).map_err(backend_err)
}

fn same_layout(parts: &[&Repacked]) -> bool {
    parts
        .windows(2)
        .all(|p| p[0].format == p[1].format && p[0].kp == p[1].kp)
}

/// `r`'s rows (heads of `hd` rows) ordered so that each rotated pair is two
/// adjacent rows: rotate-half pairs (i, i + hd/2) move to (2i, 2i + 1);
/// adjacent pairs already are.
pub fn pair_rope_rows(r: &Repacked, hd: usize, pairing: RopePairing) -> Repacked {
    if pairing == RopePairing::Adjacent || hd == 0 {
        return r.clone();
    }
    let order: Vec<usize> = (0..r.n)
        .map(|row| {
            let (h, w) = (row / hd, row % hd);
            h * hd + w / 2 + (w % 2) * (hd / 2)
        })
        .collect();
    r.permute_rows(&order)
}

/// Layer `l`'s q, k, v (`q_rows`, `kv_rows` rows of `hidden`), from their
/// own tensors or from one fused `attn_qkv` (Phi-3).
pub fn read_qkv(
    files: &ModelFiles,
    l: usize,
    q_rows: usize,
    kv_rows: usize,
    hidden: usize,
    storage: Storage,
) -> Result<[Repacked; 3], ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    match storage {
        Storage::Split => Ok([
            load_repacked(files, &n("attn_q"), q_rows, hidden)?,
            load_repacked(files, &n("attn_k"), kv_rows, hidden)?,
            load_repacked(files, &n("attn_v"), kv_rows, hidden)?,
        ]),
        Storage::Fused => {
            let all = load_repacked(files, &n("attn_qkv"), q_rows + 2 * kv_rows, hidden)?;
            Ok([
                all.slice_rows(0..q_rows),
                all.slice_rows(q_rows..q_rows + kv_rows),
                all.slice_rows(q_rows + kv_rows..q_rows + 2 * kv_rows),
            ])
        }
    }
}

/// Layer `l`'s gate and up (`inter` rows of `hidden` each), from their own
/// tensors or from one `ffn_up` holding gate then up (Phi-3).
pub fn read_gate_up(
    files: &ModelFiles,
    l: usize,
    inter: usize,
    hidden: usize,
    storage: Storage,
) -> Result<[Repacked; 2], ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    match storage {
        Storage::Split => Ok([
            load_repacked(files, &n("ffn_gate"), inter, hidden)?,
            load_repacked(files, &n("ffn_up"), inter, hidden)?,
        ]),
        Storage::Fused => {
            let all = load_repacked(files, &n("ffn_up"), 2 * inter, hidden)?;
            Ok([all.slice_rows(0..inter), all.slice_rows(inter..2 * inter)])
        }
    }
}

/// Uploads layer `l`'s q, k, v: stacked and rope-paired for `gemm_rope_kv`
/// where `rope_fused` and their formats agree, stacked where they agree, else split.
pub fn upload_qkv<B: Backend>(
    ks: &B,
    [q, k, v]: [Repacked; 3],
    l: usize,
    hd: usize,
    pairing: RopePairing,
    rope_fused: bool,
) -> Result<QkvWeights<B::Weight>, ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    if same_layout(&[&q, &k, &v]) && rope_fused {
        let (q, k) = (pair_rope_rows(&q, hd, pairing), pair_rope_rows(&k, hd, pairing));
        let qkv = Repacked::stack_rows(&[q, k, v], "q, k, v")?;
        return Ok(QkvWeights::RopeFused(upload(ks, &qkv, &n("attn_qkv"))?));
    }
    if same_layout(&[&q, &k, &v]) {
        let qkv = Repacked::stack_rows(&[q, k, v], "q, k, v")?;
        return Ok(QkvWeights::Stacked(upload(ks, &qkv, &n("attn_qkv"))?));
    }
    Ok(QkvWeights::Split {
        q: upload(ks, &q, &n("attn_q"))?,
        k: upload(ks, &k, &n("attn_k"))?,
        v: upload(ks, &v, &n("attn_v"))?,
    })
}

/// Uploads layer `l`'s gate and up: interleaved for `gemm_silu_mul` where
/// `interleave` and their formats agree, stacked where they agree, else split.
pub fn upload_gate_up<B: Backend>(
    ks: &B,
    [gate, up]: [Repacked; 2],
    l: usize,
    interleave: bool,
) -> Result<GateUpWeights<B::Weight>, ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    if !same_layout(&[&gate, &up]) {
        return Ok(GateUpWeights::Split {
            gate: upload(ks, &gate, &n("ffn_gate"))?,
            up: upload(ks, &up, &n("ffn_up"))?,
        });
    }
    if interleave {
        let w = Repacked::interleave_rows(&gate, &up, "gate, up")?;
        return Ok(GateUpWeights::Interleaved(upload(ks, &w, &n("ffn_gate_up"))?));
    }
    let w = Repacked::stack_rows(&[gate, up], "gate, up")?;
    Ok(GateUpWeights::Stacked(upload(ks, &w, &n("ffn_gate_up"))?))
}
