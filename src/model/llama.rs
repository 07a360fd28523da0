//! The Llama forward pass (candle's shape: `load` + `forward`), recorded as ops
//! of a `Backend` (wgpu or cuda) into one step:
//! embed → per layer: rms_norm(+residual) → qkv gemm with rope and the cache
//! write → paged_attention → o gemm → rms_norm(+residual) → gate·up gemm with silu·mul →
//! down gemm → final rms_norm(+residual) on the sampled rows only → lm_head → argmax.
//! Seven launches a layer on a backend that fuses them; five where it also
//! fuses the norms (`Backend::fuses_norm`: the wgpu backend, GPUs and CPU
//! adapters alike; cuda runs rms_norm on its own): the qkv and
//! gate·up gemms normalise their x rows and the o and down gemms add into the
//! residual stream. The fused weights are in `layer_weights`.

use super::layer_weights::{GateUpWeights, QkvWeights, load_gate_up, load_qkv, load_repacked};
use super::rope::rope_table_scaled;
use super::{ModelConfig, ModelError, ModelFiles, RawTensor, backend_err};
use crate::backend::{Backend, NormArgs, PagedKv, RopeArgs, Rows, WeightInfo};
use crate::quant;

/// One decoder layer's weights.
pub struct Layer<B: Backend> {
    // attn_norm, ffn_norm: (hidden) f32
    pub attn_norm: B::Buffer,
    pub ffn_norm: B::Buffer,
    // qkv: q (heads*hd, hidden), k, v (kv_heads*hd, hidden); o: (hidden, heads*hd)
    pub qkv: QkvWeights<B::Weight>,
    pub o: B::Weight,
    // gate_up: gate, up (inter, hidden); down: (hidden, inter)
    pub gate_up: GateUpWeights<B::Weight>,
    pub down: B::Weight,
}

impl<B: Backend> Layer<B> {
    /// Whether the layer's gemms can take its norms (the fused qkv and gate·up weights).
    fn fuses_norm(&self) -> bool {
        matches!(self.qkv, QkvWeights::RopeFused(_)) && matches!(self.gate_up, GateUpWeights::Interleaved(_))
    }

    /// Every matrix of the layer.
    pub fn matrices(&self) -> Vec<&B::Weight> {
        let mut v = self.qkv.weights();
        v.push(&self.o);
        v.extend(self.gate_up.weights());
        v.push(&self.down);
        v
    }
}

/// The model resident on the GPU.
pub struct LlamaModel<B: Backend> {
    pub cfg: ModelConfig,
    // embed: (vocab, hidden); also the LM head when embeddings are tied
    pub embed: B::Weight,
    pub layers: Vec<Layer<B>>,
    // final_norm: (hidden) f32
    pub final_norm: B::Buffer,
    pub lm_head: Option<B::Weight>,
    // rope: (max_context, hd/2) vec2<f32> (cos, sin)
    pub rope: B::Buffer,
    /// Bytes of weights on the GPU.
    pub weight_bytes: u64,
}

/// What one forward pass reads and writes besides the weights: the step's
/// arrays (token ids, positions, the sequence of each token, KV slots, block
/// tables, the rows to sample), each layer's paged KV cache, and the activation
/// buffers. The model runner owns all of them (as nano-vllm's does) and lends
/// them to the model for a step.
pub struct Forward<'a, B: Backend> {
    // input_ids, positions, token_seq, slot_mapping: (t) u32
    pub input_ids: &'a B::Buffer,
    pub positions: &'a B::Buffer,
    pub token_seq: &'a B::Buffer,
    pub slot_mapping: &'a B::Buffer,
    // block_tables: (seqs, max_blocks) u32; logits_rows: (n_rows) u32
    pub block_tables: &'a B::Buffer,
    pub max_blocks: u32,
    pub logits_rows: &'a B::Buffer,
    // k_cache[l], v_cache[l]: (num_blocks * block_size, kv_heads * hd) f32
    pub k_cache: &'a [B::Buffer],
    pub v_cache: &'a [B::Buffer],
    pub block_size: u32,
    /// Rows of the caches this step touches (see `PagedKv::kv_rows`).
    pub kv_rows: u32,
    /// The most tokens of one sequence in this step (see `PagedKv::max_query_len`).
    pub max_query_len: u32,
    pub act: &'a Activations<B>,
}

/// The activation buffers of the forward pass, for up to `max_tokens` tokens
/// and `max_rows` sampled rows: the model's working set, in its layout.
pub struct Activations<B: Backend> {
    // h (residual), delta, x: (max_tokens, hidden) f32
    pub h: B::Buffer,
    pub delta: B::Buffer,
    pub x: B::Buffer,
    // qkv: (max_tokens, (heads + 2 kv_heads) hd); attn: (max_tokens, heads hd)
    pub qkv: B::Buffer,
    pub attn: B::Buffer,
    // gu: (max_tokens, 2 inter); act: (max_tokens, inter)
    pub gu: B::Buffer,
    pub act: B::Buffer,
    // xf: (max_rows, hidden); logits: (max_rows, vocab) f32; sampled: (max_rows) u32
    pub xf: B::Buffer,
    pub logits: B::Buffer,
    pub sampled: B::Buffer,
}

impl<B: Backend> Activations<B> {
    pub fn new(ks: &B, cfg: &ModelConfig, max_tokens: usize, max_rows: usize) -> Result<Self, B::Error> {
        let f = |n: usize| ks.zeros((n * 4) as u64);
        Ok(Self {
            h: f(max_tokens * cfg.hidden)?,
            delta: f(max_tokens * cfg.hidden)?,
            x: f(max_tokens * cfg.hidden)?,
            qkv: f(max_tokens * cfg.qkv_width())?,
            attn: f(max_tokens * cfg.heads * cfg.head_dim)?,
            gu: f(max_tokens * 2 * cfg.intermediate)?,
            act: f(max_tokens * cfg.intermediate)?,
            xf: f(max_rows * cfg.hidden)?,
            logits: f(max_rows * cfg.vocab)?,
            sampled: f(max_rows)?,
        })
    }

    /// Bytes of all activation buffers.
    pub fn bytes(&self, ks: &B) -> u64 {
        [
            &self.h,
            &self.delta,
            &self.x,
            &self.qkv,
            &self.attn,
            &self.gu,
            &self.act,
            &self.xf,
            &self.logits,
            &self.sampled,
        ]
        .iter()
        .map(|b| ks.buffer_bytes(b))
        .sum()
    }
}

fn check_shape(t: &RawTensor, rows: usize, cols: usize) -> Result<(), ModelError> {
    if t.rows != rows || t.cols != cols {
        return Err(ModelError::Shape {
            name: t.name.clone(),
            got: vec![t.rows, t.cols],
            want: vec![rows, cols],
        });
    }
    Ok(())
}

fn load_matrix<B: Backend>(
    ks: &B,
    files: &ModelFiles,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<B::Weight, ModelError> {
    let r = load_repacked(files, name, rows, cols)?;
    ks.upload_weight(&r, name).map_err(backend_err)
}

fn load_vector<B: Backend>(ks: &B, files: &ModelFiles, name: &str, len: usize) -> Result<B::Buffer, ModelError> {
    let t = files.tensor(name)?;
    check_shape(&t, 1, len)?;
    let v = quant::dequantize(t.format, &t.bytes, 1, len).map_err(|source| ModelError::Tensor {
        name: t.name.clone(),
        source,
    })?;
    ks.upload(bytemuck::cast_slice(&v), name).map_err(backend_err)
}

impl<B: Backend> LlamaModel<B> {
    /// Uploads every weight, checking each shape against `cfg`, and prepares the kernels.
    pub fn load(ks: &B, files: &ModelFiles, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let (hd, h, hq, hk, inter) = (cfg.head_dim, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.intermediate);
        let embed = load_matrix(ks, files, "token_embd.weight", cfg.vocab, h)?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: load_vector(ks, files, &n("attn_norm"), h)?,
                ffn_norm: load_vector(ks, files, &n("ffn_norm"), h)?,
                qkv: load_qkv(ks, files, l, hq * hd, hk * hd, h, hd, cfg.rope_pairing)?,
                o: load_matrix(ks, files, &n("attn_output"), h, hq * hd)?,
                gate_up: load_gate_up(ks, files, l, inter, h)?,
                down: load_matrix(ks, files, &n("ffn_down"), h, inter)?,
            });
        }
        let final_norm = load_vector(ks, files, "output_norm.weight", h)?;
        let lm_head = if files.has("output.weight") {
            Some(load_matrix(ks, files, "output.weight", cfg.vocab, h)?)
        } else {
            None
        };
        let table = rope_table_scaled(cfg.max_context, hd, cfg.rope_theta, cfg.rope_freq_factors.as_deref());
        let rope = ks
            .upload(bytemuck::cast_slice(&table), "rope table")
            .map_err(backend_err)?;
        let mut weight_bytes = embed.device_bytes() + lm_head.as_ref().map_or(0, |w| w.device_bytes());
        for l in &layers {
            for w in l.matrices() {
                weight_bytes += WeightInfo::device_bytes(w);
            }
            weight_bytes += ks.buffer_bytes(&l.attn_norm) + ks.buffer_bytes(&l.ffn_norm);
        }
        let model = Self {
            cfg: cfg.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            weight_bytes,
        };
        model.prepare(ks)?;
        Ok(model)
    }

    /// Compiles and warms every pipeline the forward pass uses.
    fn prepare(&self, ks: &B) -> Result<(), ModelError> {
        ks.prepare_embed(&self.embed).map_err(backend_err)?;
        let mut seen = std::collections::HashSet::new();
        let l0 = &self.layers[0];
        for w in l0.matrices().into_iter().chain([self.lm_head()]) {
            if seen.insert((w.format(), w.cols().is_multiple_of(8))) {
                ks.prepare_gemm(w).map_err(backend_err)?;
            }
        }
        for l in &self.layers {
            for w in l.matrices() {
                if seen.insert((w.format(), w.cols().is_multiple_of(8))) {
                    ks.prepare_gemm(w).map_err(backend_err)?;
                }
            }
        }
        ks.prepare_attention(
            self.cfg.head_dim as u32,
            self.cfg.heads as u32,
            self.cfg.kv_heads as u32,
        )
        .map_err(backend_err)?;
        Ok(())
    }

    pub fn lm_head(&self) -> &B::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Encodes the forward pass of `t` tokens whose step arrays are already in
    /// `f`, ending with logits for the `n_rows` rows listed in `f.logits_rows`
    /// and their argmax in `f.act.sampled`.
    pub fn encode_forward(
        &self,
        ks: &B,
        enc: &mut B::Step,
        f: &Forward<B>,
        t: u32,
        n_rows: u32,
    ) -> Result<(), B::Error> {
        let b = f.act;
        let c = &self.cfg;
        let (hd, hq, hk) = (c.head_dim as u32, c.heads as u32, c.kv_heads as u32);
        let (hidden, inter, qkv_w) = (c.hidden as u32, c.intermediate as u32, c.qkv_width() as u32);
        let eps = c.rms_eps;
        ks.embed(enc, &self.embed, f.input_ids, t, &b.h)?;
        // With the norms fused, h is the residual stream throughout: the qkv
        // and gate·up gemms normalise it as they read it, o and down add to it.
        let fused = ks.fuses_norm(hidden) && self.layers.iter().all(Layer::fuses_norm);
        let norm = |w| fused.then_some(NormArgs { w, eps });
        let (x, mlp_out) = if fused { (&b.h, &b.h) } else { (&b.x, &b.delta) };
        let x = Rows::new(x, c.hidden);
        for (l, layer) in self.layers.iter().enumerate() {
            // Layer 0 normalises the embeddings; later layers first add the last
            // MLP output (in delta) to the residual stream h.
            let (input, residual) = if l == 0 { (&b.h, None) } else { (&b.delta, Some(&b.h)) };
            if !fused {
                ks.rms_norm(
                    enc,
                    Rows::new(input, c.hidden),
                    &layer.attn_norm,
                    residual,
                    None,
                    eps,
                    t,
                    hidden,
                    &b.x,
                )?;
            }
            let qkv_at = |off: u32| Rows {
                buf: &b.qkv,
                off,
                stride: qkv_w,
            };
            let paged = PagedKv {
                k_cache: &f.k_cache[l],
                v_cache: &f.v_cache[l],
                kv_heads: hk,
                head_dim: hd,
                block_size: f.block_size,
                positions: f.positions,
                token_seq: f.token_seq,
                block_tables: f.block_tables,
                max_blocks: f.max_blocks,
                kv_rows: f.kv_rows,
                max_query_len: f.max_query_len,
            };
            let rope = RopeArgs {
                positions: f.positions,
                table: &self.rope,
                max_pos: c.max_context as u32,
                pairing: c.rope_pairing,
            };
            let attn_norm = norm(&layer.attn_norm);
            match &layer.qkv {
                QkvWeights::RopeFused(w) => {
                    ks.gemm_rope_kv(enc, w, x, attn_norm, qkv_at(0), rope, paged, hq, f.slot_mapping, t)?
                }
                QkvWeights::Stacked(w) => {
                    ks.gemm(enc, w, x, qkv_at(0), t)?;
                    ks.rope_cache_write(enc, &b.qkv, qkv_w, rope, paged, hq, f.slot_mapping, t)?;
                }
                QkvWeights::Split { q, k, v } => {
                    ks.gemm(enc, q, x, qkv_at(0), t)?;
                    ks.gemm(enc, k, x, qkv_at(hq * hd), t)?;
                    ks.gemm(enc, v, x, qkv_at((hq + hk) * hd), t)?;
                    ks.rope_cache_write(enc, &b.qkv, qkv_w, rope, paged, hq, f.slot_mapping, t)?;
                }
            }
            ks.paged_attention(enc, &b.qkv, qkv_w, paged, hq, t, &b.attn)?;
            let attn = Rows::new(&b.attn, (hq * hd) as usize);
            if fused {
                ks.gemm_residual(enc, &layer.o, attn, Rows::new(&b.h, c.hidden), t)?;
            } else {
                ks.gemm(enc, &layer.o, attn, Rows::new(&b.delta, c.hidden), t)?;
                let delta = Rows::new(&b.delta, c.hidden);
                ks.rms_norm(enc, delta, &layer.ffn_norm, Some(&b.h), None, eps, t, hidden, &b.x)?;
            }
            let gu_at = |off: u32| Rows {
                buf: &b.gu,
                off,
                stride: 2 * inter,
            };
            match &layer.gate_up {
                GateUpWeights::Interleaved(w) => {
                    let act = Rows::new(&b.act, c.intermediate);
                    ks.gemm_silu_mul(enc, w, x, norm(&layer.ffn_norm), act, t)?;
                }
                GateUpWeights::Stacked(w) => {
                    ks.gemm(enc, w, x, gu_at(0), t)?;
                    ks.silu_mul(enc, &b.gu, &b.act, t, inter)?;
                }
                GateUpWeights::Split { gate, up } => {
                    ks.gemm(enc, gate, x, gu_at(0), t)?;
                    ks.gemm(enc, up, x, gu_at(inter), t)?;
                    ks.silu_mul(enc, &b.gu, &b.act, t, inter)?;
                }
            }
            let (act, out) = (Rows::new(&b.act, c.intermediate), Rows::new(mlp_out, c.hidden));
            if fused {
                ks.gemm_residual(enc, &layer.down, act, out, t)?;
            } else {
                ks.gemm(enc, &layer.down, act, out, t)?;
            }
        }
        // The last MLP output is in h already where the norms are fused, else in delta.
        let (last, residual) = if fused { (&b.h, None) } else { (&b.delta, Some(&b.h)) };
        ks.rms_norm(
            enc,
            Rows::new(last, c.hidden),
            &self.final_norm,
            residual,
            Some(f.logits_rows),
            eps,
            n_rows,
            hidden,
            &b.xf,
        )?;
        ks.gemm(
            enc,
            self.lm_head(),
            Rows::new(&b.xf, c.hidden),
            Rows::new(&b.logits, c.vocab),
            n_rows,
        )?;
        ks.argmax(enc, &b.logits, c.vocab as u32, n_rows, &b.sampled)?;
        Ok(())
    }
}
