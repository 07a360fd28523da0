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
use super::{ModelError, ModelFiles, RawTensor, backend_err};
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

/// Fails unless `t` is `rows` x `cols`.
pub fn check_shape(t: &RawTensor, rows: usize, cols: usize) -> Result<(), ModelError> {
    if t.rows != rows || t.cols != cols {
        return Err(ModelError::Shape {
            name: t.name.clone(),
            got: vec![t.rows, t.cols],
            want: vec![rows, cols],
        });
    }
    Ok(())
}

/// Reads and repacks `name`, checking its shape.
pub fn load_repacked(files: &ModelFiles, name: &str, rows: usize, cols: usize) -> Result<Repacked, ModelError> {
    let t = files.tensor(name)?;
    check_shape(&t, rows, cols)?;
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

/// Layer `l`'s matrices `names` (`rows[i]` rows of `hidden` each), from
/// their own tensors or, where `storage` is fused, from tensor `fused` holding
/// their rows one after the other (Phi-3's `attn_qkv`; its `ffn_up`, gate then up).
fn read_parts<const N: usize>(
    files: &ModelFiles,
    l: usize,
    names: [&str; N],
    fused: &str,
    rows: [usize; N],
    hidden: usize,
    storage: Storage,
) -> Result<[Repacked; N], ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let parts: Vec<Repacked> = match storage {
        Storage::Split => names
            .iter()
            .zip(rows)
            .map(|(name, r)| load_repacked(files, &n(name), r, hidden))
            .collect::<Result<_, _>>()?,
        Storage::Fused => {
            let all = load_repacked(files, &n(fused), rows.iter().sum(), hidden)?;
            let mut start = 0;
            rows.iter()
                .map(|&r| {
                    start += r;
                    all.slice_rows(start - r..start)
                })
                .collect()
        }
    };
    let got = parts.len();
    parts
        .try_into()
        .map_err(|_| ModelError::Config(format!("layer {l}: {got} matrices read where {N} were named")))
}

/// Layer `l`'s q, k, v (`q_rows`, `kv_rows` rows of `hidden`).
pub fn read_qkv(
    files: &ModelFiles,
    l: usize,
    q_rows: usize,
    kv_rows: usize,
    hidden: usize,
    storage: Storage,
) -> Result<[Repacked; 3], ModelError> {
    let names = ["attn_q", "attn_k", "attn_v"];
    read_parts(files, l, names, "attn_qkv", [q_rows, kv_rows, kv_rows], hidden, storage)
}

/// Layer `l`'s gate and up (`inter` rows of `hidden` each).
pub fn read_gate_up(
    files: &ModelFiles,
    l: usize,
    inter: usize,
    hidden: usize,
    storage: Storage,
) -> Result<[Repacked; 2], ModelError> {
    read_parts(
        files,
        l,
        ["ffn_gate", "ffn_up"],
        "ffn_up",
        [inter, inter],
        hidden,
        storage,
    )
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
