//! `FusedOps`: the fused forms of a layer's gemms that a backend may offer
//! (the WGSL kernels do): the gemm with its residual add, gate·up with the
//! activation, q/k/v with rope and the cache write, and the rms_norms inside
//! them. Each gives the same bits as the unfused chain, so the model decides
//! once, at load (`model::fusion`), from what `Backend::fused` offers, and lays
//! the weights out for it. A backend without them names `Unfused`, a type with
//! no values: none of these ops can be called on it.

use super::{Backend, NormArgs, PagedKv, RopeArgs, Rows};

/// A backend's fused ops (see the module comment).
#[allow(clippy::too_many_arguments)]
pub trait FusedOps<B: Backend + ?Sized> {
    /// Whether the gemms take the layer's rms_norms and residual adds (for
    /// rows of `d` floats): `gemm_silu_mul` and `gemm_rope_kv` normalise their
    /// x rows (`NormArgs`) and `gemm_residual` adds into the residual stream,
    /// so a layer runs without `rms_norm`. When false the model runs
    /// `rms_norm` (with its residual add) before those gemms.
    fn fuses_norm(&self, d: u32) -> bool;

    /// y[t, :N] += X[t, :K] · Wᵀ for `t` rows: `gemm` with the residual add
    /// (each element reduced exactly as `gemm` reduces it, then added to y's).
    /// Only called where `fuses_norm` is true.
    fn gemm_residual(
        &self,
        s: &mut B::Step,
        w: &B::Weight,
        x: Rows<B::Buffer>,
        y: Rows<B::Buffer>,
        t: u32,
    ) -> Result<(), B::Error>;

    /// Whether `gemm_silu_mul` runs (as one kernel); when false the model runs
    /// gate and up as one stacked `gemm` and then `silu_mul`.
    fn fuses_gate_up(&self) -> bool;

    /// out[t, i] = silu(Y[t, 2i]) · Y[t, 2i + 1] for `t` rows, where Y = X · Wᵀ
    /// and W interleaves gate and up rows (gate i at row 2i, up i at 2i + 1;
    /// `quant::Repacked::interleave_rows`): the MLP's gate, up and silu·mul in
    /// one op. Each Y element is reduced exactly as `gemm` reduces it. Only
    /// called where `fuses_gate_up` is true; `norm` only where `fuses_norm`.
    fn gemm_silu_mul(
        &self,
        s: &mut B::Step,
        w: &B::Weight,
        x: Rows<B::Buffer>,
        norm: Option<NormArgs<B::Buffer>>,
        out: Rows<B::Buffer>,
        t: u32,
    ) -> Result<(), B::Error>;

    /// Whether `gemm_rope_kv` runs (as one kernel); when false the model runs
    /// the qkv `gemm` and then `rope_cache_write`.
    fn fuses_qkv_rope(&self) -> bool;

    /// The qkv `gemm`, then `rope_cache_write`, as one op: W stacks q, k, v
    /// (`q_heads`, `kv.kv_heads`, `kv.kv_heads` heads of `kv.head_dim` rows),
    /// its q and k rows ordered so each rotated pair is two adjacent rows
    /// (`layer_weights::pair_rope_rows`). Each qkv element is reduced exactly
    /// as `gemm` reduces it and rotated exactly as `rope` rotates it. Only
    /// called where `fuses_qkv_rope` is true; `norm` only where `fuses_norm`.
    fn gemm_rope_kv(
        &self,
        s: &mut B::Step,
        w: &B::Weight,
        x: Rows<B::Buffer>,
        norm: Option<NormArgs<B::Buffer>>,
        qkv: Rows<B::Buffer>,
        rope: RopeArgs<B::Buffer>,
        kv: PagedKv<B::Buffer>,
        q_heads: u32,
        slot_mapping: &B::Buffer,
        t: u32,
    ) -> Result<(), B::Error>;
}

/// The fused ops of a backend that has none: no value of it exists, so
/// `Backend::fused` can only return `None` and no fused op can run.
#[derive(Debug)]
pub enum Unfused {}

#[allow(clippy::too_many_arguments)]
impl<B: Backend> FusedOps<B> for Unfused {
    fn fuses_norm(&self, _d: u32) -> bool {
        match *self {}
    }

    fn gemm_residual(
        &self,
        _s: &mut B::Step,
        _w: &B::Weight,
        _x: Rows<B::Buffer>,
        _y: Rows<B::Buffer>,
        _t: u32,
    ) -> Result<(), B::Error> {
        match *self {}
    }

    fn fuses_gate_up(&self) -> bool {
        match *self {}
    }

    fn gemm_silu_mul(
        &self,
        _s: &mut B::Step,
        _w: &B::Weight,
        _x: Rows<B::Buffer>,
        _norm: Option<NormArgs<B::Buffer>>,
        _out: Rows<B::Buffer>,
        _t: u32,
    ) -> Result<(), B::Error> {
        match *self {}
    }

    fn fuses_qkv_rope(&self) -> bool {
        match *self {}
    }

    fn gemm_rope_kv(
        &self,
        _s: &mut B::Step,
        _w: &B::Weight,
        _x: Rows<B::Buffer>,
        _norm: Option<NormArgs<B::Buffer>>,
        _qkv: Rows<B::Buffer>,
        _rope: RopeArgs<B::Buffer>,
        _kv: PagedKv<B::Buffer>,
        _q_heads: u32,
        _slot_mapping: &B::Buffer,
        _t: u32,
    ) -> Result<(), B::Error> {
        match *self {}
    }
}
