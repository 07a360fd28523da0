//! The ops interface the model calls. One forward pass is a sequence of these
//! ops recorded into a `Step` and finished with one `finish` (which also reads
//! back what the host needs). Two backends implement it: wgpu (`Kernels`, the
//! WGSL kernels, every adapter) and, behind `--features cuda`, `CudaBackend`
//! (CUDA C kernels compiled by NVRTC, cuBLAS for prefill GEMMs).
//!
//! Every op states its semantics here once; the backends must agree with each
//! other and with the CPU references in the tests.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
mod error;
mod fused;
mod open;
pub mod wgsl;

pub use open::{OpenBackend, OpenTimings, gpu_options, open};

/// The KV cache's element type (a setting, defined with the others).
pub use crate::config::KvDtype;
pub use device::Device;
pub use error::BackendError;
pub use fused::{FusedOps, Unfused};

use crate::gpu::PipelineStats;
use crate::quant::{Repacked, WeightFormat};

/// Rows of activations in a buffer of f32: element `off + t*stride` starts row `t`.
#[derive(Debug)]
pub struct Rows<'a, B> {
    pub buf: &'a B,
    pub off: u32,
    pub stride: u32,
}

impl<B> Clone for Rows<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Rows<'_, B> {}

impl<'a, B> Rows<'a, B> {
    pub fn new(buf: &'a B, stride: usize) -> Self {
        Self {
            buf,
            off: 0,
            stride: stride as u32,
        }
    }
}

/// Greedy picks under structured-output masks: `out[i]` = the lowest index of
/// the largest value of logits row `rows[i]` (rows of `n`) among the tokens
/// allowed by mask row `i` (`words` u32s; bit k % 32 of word k / 32 allows
/// token k); `u32::MAX` when none is allowed. NaN never wins.
#[derive(Debug)]
pub struct MaskedArgmax<'a, B> {
    pub x: &'a B,
    pub n: u32,
    // mask: (count, words) u32; rows, out: (count) u32
    pub mask: &'a B,
    pub words: u32,
    pub rows: &'a B,
    pub count: u32,
    pub out: &'a B,
}

/// The paged KV cache and step arrays `paged_attention` reads.
#[derive(Debug)]
pub struct PagedKv<'a, B> {
    // k_cache, v_cache: (num_blocks * block_size, kv_heads * head_dim) of `dtype`
    pub k_cache: &'a B,
    pub v_cache: &'a B,
    /// The caches' element type (as `Backend::kv_cache` made them).
    pub dtype: KvDtype,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    // positions, token_seq: (T) u32; block_tables: (S, max_blocks) u32
    pub positions: &'a B,
    pub token_seq: &'a B,
    pub block_tables: &'a B,
    pub max_blocks: u32,
    /// Rows of the caches this step may touch: a prefix of the pool that holds
    /// every block in `block_tables` (a backend may bind only these).
    pub kv_rows: u32,
    /// The most query tokens of one sequence in this step (1 when every token
    /// is a decode; a prefill chunk's length). A backend may pick a kernel
    /// variant from it, never a different result.
    pub max_query_len: u32,
    /// Sliding window: token t attends to the last `window` positions only
    /// (`positions[t] + 1 - window ..= positions[t]`); 0 attends to them all.
    pub window: u32,
    /// The score of a key: q·k · `scale` (usually 1/√head_dim)…
    pub scale: f32,
    /// …then `softcap · tanh(score / softcap)` where `softcap` > 0 (Gemma 2).
    pub softcap: f32,
}

impl<B> PagedKv<'_, B> {
    /// The usual attention scale, 1/√head_dim.
    pub fn default_scale(head_dim: u32) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }
}

impl<B> Clone for PagedKv<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for PagedKv<'_, B> {}

/// The rms_norm a gemm applies to its x rows as it reads them, where the
/// backend fuses it (`Backend::fuses_norm`): x̂ = x / sqrt(mean(x²) + eps) · w,
/// `w` the norm weight (K floats).
#[derive(Debug)]
pub struct NormArgs<'a, B> {
    pub w: &'a B,
    pub eps: f32,
}

impl<B> Clone for NormArgs<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for NormArgs<'_, B> {}

/// The activation of a gated MLP: out = act(gate) · up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(g) = g / (1 + e^-g) (Llama, Qwen, Phi-3).
    Silu = 0,
    /// gelu with the tanh approximation, 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) (Gemma).
    GeluTanh = 1,
}

/// An in-place elementwise op over the first n floats of a buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elementwise {
    /// x = x · s (Gemma's embedding scale).
    Scale(f32),
    /// x = c · tanh(x / c) (Gemma 2's final logit soft-capping).
    Softcap(f32),
}

/// How rotary pairs are formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (i, i + d/2): Hugging Face checkpoints.
    RotateHalf = 0,
    /// (2i, 2i + 1): GGUF llama.
    Adjacent = 1,
}

/// The rotary embedding's inputs: each token's position and the (cos, sin)
/// table of `rope_table_scaled`, clamped to `max_pos` rows.
#[derive(Debug)]
pub struct RopeArgs<'a, B> {
    // positions: (T) u32; table: (max_pos, head_dim/2) vec2<f32>
    pub positions: &'a B,
    pub table: &'a B,
    pub max_pos: u32,
    pub pairing: RopePairing,
}

impl<B> Clone for RopeArgs<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for RopeArgs<'_, B> {}

/// Shape and format of a weight as a backend holds it.
pub trait WeightInfo {
    fn format(&self) -> WeightFormat;
    /// Output rows (N).
    fn rows(&self) -> usize;
    /// Row length (K).
    fn cols(&self) -> usize;
    /// Device bytes the weight occupies.
    fn device_bytes(&self) -> u64;
}

/// The ops a forward pass is made of, on one device.
#[allow(clippy::too_many_arguments)]
pub trait Backend: Send + 'static {
    /// A device buffer (f32 or u32 elements).
    type Buffer: Send + Sync;
    /// A weight matrix in the `quant::repack` layout.
    type Weight: WeightInfo + Send + Sync;
    /// The ops of one step being recorded.
    type Step;
    /// The backend's own error type.
    type Error: std::error::Error + Send + Sync + 'static + Into<BackendError>;
    /// Its fused ops (`Unfused` where it has none).
    type Fused: FusedOps<Self>;

    /// The device, in words (name, API, driver).
    fn describe(&self) -> String;
    /// Another handle on the same device, with step state of its own, for a
    /// second model beside this one (a draft model): pipelines and device shared.
    fn sibling(&self) -> Result<Self, Self::Error>
    where
        Self: Sized;
    /// The largest single buffer the backend can address in one op (caps a layer's KV pool).
    fn max_buffer(&self) -> u64;
    /// The device's memory, where its driver reports it (the memory plan).
    fn device_memory(&self) -> Option<crate::gpu::DeviceMemory> {
        None
    }
    /// Whether the device's memory is the host's (CPU adapters): the memory
    /// plan then keeps the fixed KV pool unless told a share.
    fn shares_host_memory(&self) -> bool {
        false
    }
    /// An error the device raised outside any op since the last call (wgpu:
    /// out of memory while allocating): the engine's load checks it.
    fn take_device_error(&self) -> Option<Self::Error> {
        None
    }
    /// Whether the gemm and embed read the narrow weight layouts
    /// (`quant::planes`); where not, `upload_weight` widens them.
    fn reads_narrow_weights(&self) -> bool {
        false
    }

    /// A zeroed buffer of `bytes`.
    fn zeros(&self, bytes: u64) -> Result<Self::Buffer, Self::Error>;
    /// A buffer holding `data`.
    fn upload(&self, data: &[u8], label: &str) -> Result<Self::Buffer, Self::Error>;
    /// A zeroed K or V cache of `rows` token slots of `width` elements of
    /// `dtype` (one layer slot of the paged pool). Only the cache ops
    /// (`cache_write`, `rope_cache_write`, `gemm_rope_kv`, `paged_attention`),
    /// told the same dtype, may touch it: a backend may hold it in another
    /// form than a plain buffer (wgpu on CPU adapters: a texture, which
    /// llvmpipe reads eight lanes at a time).
    fn kv_cache(&self, rows: u64, width: u32, dtype: KvDtype) -> Result<Self::Buffer, Self::Error> {
        self.zeros(rows * dtype.row_bytes(u64::from(width)))
    }
    /// Bytes of a buffer.
    fn buffer_bytes(&self, b: &Self::Buffer) -> u64;
    /// Overwrites the start of `buf` with `data`, ordered before the next step's ops.
    fn write(&self, buf: &Self::Buffer, data: &[u8]) -> Result<(), Self::Error>;
    /// Uploads a repacked weight.
    fn upload_weight(&self, r: &Repacked, label: &str) -> Result<Self::Weight, Self::Error>;

    /// Checks (and reserves) what `gemm` over `w` needs; a backend may compile lazily.
    fn prepare_gemm(&self, w: &Self::Weight) -> Result<(), Self::Error>;
    /// Checks what `embed` over `w` needs.
    fn prepare_embed(&self, w: &Self::Weight) -> Result<(), Self::Error>;
    /// Checks that `paged_attention` supports a head shape.
    fn prepare_attention(&self, head_dim: u32, heads: u32, kv_heads: u32) -> Result<(), Self::Error>;

    /// The row-tile caps batched gemms over weights of `format` may run
    /// under, largest first (none: the backend's own tiles only). Every tile
    /// gives the same bits: where there are two or more, the engine's warm-up
    /// times a step under each and keeps the fastest (`set_row_tile_cap`).
    fn row_tile_caps(&self, _format: WeightFormat) -> Vec<u32> {
        Vec::new()
    }
    /// Caps the row tile of batched gemms (one of `row_tile_caps`).
    fn set_row_tile_cap(&self, _cap: u32) {}
    /// The row-tile cap in force (`u32::MAX`: none).
    fn row_tile_cap(&self) -> u32 {
        u32::MAX
    }

    /// Pipelines compiled on this device so far (backends that compile ahead report none).
    fn pipeline_stats(&self) -> PipelineStats {
        PipelineStats::default()
    }

    /// Starts recording a step.
    fn begin(&self) -> Self::Step;
    /// Runs (or waits for) the step and returns the first `bytes` of each buffer in `reads`.
    fn finish(&self, step: Self::Step, reads: &[(&Self::Buffer, u64)]) -> Result<Vec<Vec<u8>>, Self::Error>;

    /// Y[t, :N] = X[t, :K] · Wᵀ for `t` rows.
    fn gemm(
        &self,
        s: &mut Self::Step,
        w: &Self::Weight,
        x: Rows<Self::Buffer>,
        y: Rows<Self::Buffer>,
        t: u32,
    ) -> Result<(), Self::Error>;

    /// out[t, :] = W[ids[t], :] as f32 for `t` tokens.
    fn embed(
        &self,
        s: &mut Self::Step,
        w: &Self::Weight,
        ids: &Self::Buffer,
        t: u32,
        out: &Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// y[i] = h / sqrt(mean(h²) + eps) · w over rows of length `d`, h = x[src(i)];
    /// with `residual` r, h = r[src] + x[src] and h is written back to r; with
    /// `rows`, src(i) = rows[i], else i. `t` output rows.
    fn rms_norm(
        &self,
        s: &mut Self::Step,
        x: Rows<Self::Buffer>,
        w: &Self::Buffer,
        residual: Option<&Self::Buffer>,
        rows: Option<&Self::Buffer>,
        eps: f32,
        t: u32,
        d: u32,
        y: &Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Rotates, in place, the first `heads` heads of each of `t` rows of `x`
    /// (row stride `stride`) by the (cos, sin) pairs of `table[min(pos, max_pos-1)]`.
    fn rope(
        &self,
        s: &mut Self::Step,
        x: &Self::Buffer,
        stride: u32,
        positions: &Self::Buffer,
        table: &Self::Buffer,
        max_pos: u32,
        t: u32,
        heads: u32,
        head_dim: u32,
        pairing: RopePairing,
    ) -> Result<(), Self::Error>;

    /// The fused forms of the layer's gemms (`FusedOps`), where the backend
    /// has them; `None`: the model runs the unfused chain.
    fn fused(&self) -> Option<&Self::Fused>;

    /// `rope` of the q and k heads (the first `q_heads + kv_heads` heads) of
    /// each row of the fused `qkv`, then `cache_write` of its K and V (the
    /// `kv_heads` heads after the q heads, and those after them): one op where
    /// the backend fuses them, else the two in turn.
    fn rope_cache_write(
        &self,
        s: &mut Self::Step,
        qkv: &Self::Buffer,
        stride: u32,
        rope: RopeArgs<Self::Buffer>,
        kv: PagedKv<Self::Buffer>,
        q_heads: u32,
        slot_mapping: &Self::Buffer,
        t: u32,
    ) -> Result<(), Self::Error> {
        rope_then_cache_write(self, s, qkv, stride, rope, kv, q_heads, slot_mapping, t)
    }

    /// out[t, i] = act(gu[t, i]) · gu[t, inter + i].
    fn act_mul(
        &self,
        s: &mut Self::Step,
        gu: &Self::Buffer,
        out: &Self::Buffer,
        t: u32,
        inter: u32,
        act: Activation,
    ) -> Result<(), Self::Error>;

    /// x[t, i] += bias[i] for i < n, over `t` rows (q/k/v biases).
    fn add_bias(
        &self,
        s: &mut Self::Step,
        x: Rows<Self::Buffer>,
        bias: &Self::Buffer,
        n: u32,
        t: u32,
    ) -> Result<(), Self::Error>;

    /// RMSNorm of each head, in place: for each of `t` rows and head h <
    /// `heads`, the `head_dim` floats v at `x.off + row·x.stride + h·head_dim`
    /// become v / sqrt(mean(v²) + eps) · w (w: head_dim floats). The sum of
    /// squares is reduced in an order that depends on head_dim only (Qwen 3's
    /// and Gemma 3's q/k norms).
    fn head_norm(
        &self,
        s: &mut Self::Step,
        x: Rows<Self::Buffer>,
        w: &Self::Buffer,
        eps: f32,
        heads: u32,
        head_dim: u32,
        t: u32,
    ) -> Result<(), Self::Error>;

    /// `op` over the first `n` floats of `x`, in place.
    fn elementwise(&self, s: &mut Self::Step, x: &Self::Buffer, n: u32, op: Elementwise) -> Result<(), Self::Error>;

    /// Copies K (at `k_off`) and V (at `v_off`) of each of `t` rows of `qkv`,
    /// `kv_width` floats each, to row `slot_mapping[t]` of the caches (of
    /// `dtype`: f16 rounds each value to the nearest half); every slot is
    /// below `kv_rows` (a backend may bind only those rows).
    fn cache_write(
        &self,
        s: &mut Self::Step,
        qkv: Rows<Self::Buffer>,
        k_off: u32,
        v_off: u32,
        kv_width: u32,
        slot_mapping: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        kv_rows: u32,
        dtype: KvDtype,
        t: u32,
    ) -> Result<(), Self::Error>;

    /// Causal attention of `t` query rows (`heads` heads at the start of each
    /// `q_stride`-long row of `q`; `u32::MAX` = heads·head_dim) over the paged
    /// cache: token t attends to positions 0..=positions[t] of sequence
    /// token_seq[t]. GQA: query head h reads KV head h / (heads / kv_heads).
    fn paged_attention(
        &self,
        s: &mut Self::Step,
        q: &Self::Buffer,
        q_stride: u32,
        kv: PagedKv<Self::Buffer>,
        heads: u32,
        t: u32,
        out: &Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// out[r] = the lowest index of the largest value of row r (`rows` rows of `n`; NaN never wins).
    fn argmax(
        &self,
        s: &mut Self::Step,
        x: &Self::Buffer,
        n: u32,
        rows: u32,
        out: &Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Greedy sampling under structured-output masks (see `MaskedArgmax`).
    fn masked_argmax(&self, s: &mut Self::Step, a: MaskedArgmax<'_, Self::Buffer>) -> Result<(), Self::Error>;
}

/// `rope` of the q and k heads of each `qkv` row, then `cache_write` of its K
/// and V: `Backend::rope_cache_write` for a backend that does not fuse them
/// (and for a wgpu cache held as textures).
#[allow(clippy::too_many_arguments)]
pub fn rope_then_cache_write<B: Backend + ?Sized>(
    b: &B,
    s: &mut B::Step,
    qkv: &B::Buffer,
    stride: u32,
    rope: RopeArgs<B::Buffer>,
    kv: PagedKv<B::Buffer>,
    q_heads: u32,
    slot_mapping: &B::Buffer,
    t: u32,
) -> Result<(), B::Error> {
    let hd = kv.head_dim;
    b.rope(
        s,
        qkv,
        stride,
        rope.positions,
        rope.table,
        rope.max_pos,
        t,
        q_heads + kv.kv_heads,
        hd,
        rope.pairing,
    )?;
    b.cache_write(
        s,
        Rows {
            buf: qkv,
            off: 0,
            stride,
        },
        q_heads * hd,
        (q_heads + kv.kv_heads) * hd,
        kv.kv_heads * hd,
        slot_mapping,
        kv.k_cache,
        kv.v_cache,
        kv.kv_rows,
        kv.dtype,
        t,
    )
}
