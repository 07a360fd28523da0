//! The decoder forward pass of every family (candle's shape: `load` +
//! `forward`), recorded as ops of a `Backend` (wgpu or cuda) into one step:
//! embed (× the family's scale) → per layer: rms_norm(+residual) → q, k, v
//! gemm (+ biases, + q/k head norms) with rope and the cache write →
//! paged_attention (sliding window and soft-cap where the layer has them) →
//! o gemm (→ post-norm) → rms_norm(+residual) → gate·up gemm with act·mul →
//! down gemm (→ post-norm) → final rms_norm(+residual) on the sampled rows only
//! → lm_head (→ soft-cap) → argmax. What a family adds is in `cfg.spec`
//! (`model::arch`); what runs fused was decided at load (`model::fusion`): on
//! the wgpu backend a Llama layer is five launches (the norms in the gemms),
//! seven where only the qkv/rope and gate·up fusions hold.

use super::fusion::Fusion;
use super::layer_weights::{
    GateUpWeights, QkvWeights, check_shape, load_repacked, read_gate_up, read_qkv, upload_gate_up, upload_qkv,
};
use super::rope::rope_table_scaled;
use super::{ModelConfig, ModelError, ModelFiles, backend_err};
use crate::backend::{Backend, Elementwise, FusedOps, KvDtype, NormArgs, PagedKv, RopeArgs, Rows, WeightInfo};
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
    // qkv_bias: (qkv_width) f32, q|k|v; q_norm, k_norm: (hd) f32
    pub qkv_bias: Option<B::Buffer>,
    pub q_norm: Option<B::Buffer>,
    pub k_norm: Option<B::Buffer>,
    // post_attn_norm, post_ffn_norm: (hidden) f32
    pub post_attn_norm: Option<B::Buffer>,
    pub post_ffn_norm: Option<B::Buffer>,
    /// Which of the model's rope tables the layer reads.
    pub rope: usize,
    /// The layer's sliding window (0: none).
    pub window: u32,
}

impl<B: Backend> Layer<B> {
    /// Whether the layer's gemms can take its norms (the fused qkv and gate·up weights).
    fn has_fused_weights(&self) -> bool {
        matches!(self.qkv, QkvWeights::RopeFused(_)) && matches!(self.gate_up, GateUpWeights::Interleaved(_))
    }

    /// Every vector of the layer (norms, biases).
    pub fn vectors(&self) -> Vec<&B::Buffer> {
        let mut v = vec![&self.attn_norm, &self.ffn_norm];
        for b in [
            &self.qkv_bias,
            &self.q_norm,
            &self.k_norm,
            &self.post_attn_norm,
            &self.post_ffn_norm,
        ] {
            v.extend(b.as_ref());
        }
        v
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

/// The backend's fused ops. A layer holds weights laid out for them only where
/// `Fusion::decide` found them on the backend it loaded on (`Backend::fused`
/// is `Some` for every `Kernels`, `None` for every `CudaBackend`), so this
/// holds whenever a fused layout is met.
fn fused_ops<B: Backend>(ks: &B) -> &B::Fused {
    ks.fused()
        .expect("weights laid out for fused ops were loaded where the backend has them")
}

/// The model resident on the GPU.
pub struct DecoderModel<B: Backend> {
    pub cfg: ModelConfig,
    // embed: (vocab, hidden); also the LM head when embeddings are tied
    pub embed: B::Weight,
    pub layers: Vec<Layer<B>>,
    // final_norm: (hidden) f32
    pub final_norm: B::Buffer,
    pub lm_head: Option<B::Weight>,
    // ropes: (max_context, hd/2) vec2<f32> (cos, sin), one per distinct rope base
    pub ropes: Vec<B::Buffer>,
    /// Bytes of weights on the GPU.
    pub weight_bytes: u64,
    /// What runs fused (decided at load).
    pub fusion: Fusion,
}

/// What one forward pass reads and writes besides the weights: the step's
/// arrays (token ids, positions, the sequence of each token, the rows to
/// sample), each layer's paged KV cache with its KV group's slots and block
/// tables, and the activation buffers. The model runner owns all of them (as
/// nano-vllm's does) and lends them to the model for a step.
pub struct Forward<'a, B: Backend> {
    // input_ids, positions, token_seq: (t) u32
    pub input_ids: &'a B::Buffer,
    pub positions: &'a B::Buffer,
    pub token_seq: &'a B::Buffer,
    pub max_blocks: u32,
    // logits_rows: (n_rows) u32
    pub logits_rows: &'a B::Buffer,
    /// Each layer's cache and its group's step arrays.
    pub kv: &'a [LayerKv<'a, B>],
    pub block_size: u32,
    /// The most tokens of one sequence in this step (see `PagedKv::max_query_len`).
    pub max_query_len: u32,
    pub act: &'a Activations<B>,
    /// Also every row's final-normed hidden state into `act.x` (embeddings).
    pub all_hidden: bool,
}

/// One layer's paged KV cache in a step: its K and V buffers (the layer's
/// slot of the pool) and its KV group's slot mapping and block tables.
pub struct LayerKv<'a, B: Backend> {
    // k, v: (num_blocks * block_size, kv_heads * hd) of `dtype`
    pub k: &'a B::Buffer,
    pub v: &'a B::Buffer,
    pub dtype: KvDtype,
    // slot_mapping: (t) u32; block_tables: (seqs, max_blocks) u32
    pub slot_mapping: &'a B::Buffer,
    pub block_tables: &'a B::Buffer,
    /// Rows of the caches this step touches (see `PagedKv::kv_rows`).
    pub kv_rows: u32,
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
    // post: (max_tokens, hidden), a sublayer's output after its post-norm (Gemma)
    pub post: Option<B::Buffer>,
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
            post: match cfg.spec.post_norms {
                true => Some(f(max_tokens * cfg.hidden)?),
                false => None,
            },
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
        .into_iter()
        .chain(&self.post)
        .map(|b| ks.buffer_bytes(b))
        .sum()
    }
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

fn read_vector(files: &ModelFiles, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = files.tensor(name)?;
    check_shape(&t, 1, len)?;
    quant::dequantize(t.format, &t.bytes, 1, len).map_err(|source| ModelError::Tensor {
        name: t.name.clone(),
        source,
    })
}

fn upload_f32<B: Backend>(ks: &B, v: &[f32], label: &str) -> Result<B::Buffer, ModelError> {
    ks.upload(bytemuck::cast_slice(v), label).map_err(backend_err)
}

/// An RMSNorm weight, with the family's offset added (Hugging Face Gemma's 1 + w).
fn load_norm<B: Backend>(
    ks: &B,
    files: &ModelFiles,
    cfg: &ModelConfig,
    name: &str,
    len: usize,
) -> Result<B::Buffer, ModelError> {
    let mut v = read_vector(files, name, len)?;
    if cfg.spec.norm_offset != 0.0 {
        v.iter_mut().for_each(|x| *x += cfg.spec.norm_offset);
    }
    upload_f32(ks, &v, name)
}

/// Layer `l`'s q, k and v biases as one q|k|v vector.
fn load_qkv_bias<B: Backend>(ks: &B, files: &ModelFiles, cfg: &ModelConfig, l: usize) -> Result<B::Buffer, ModelError> {
    let (q, kv) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let mut v = read_vector(files, &format!("blk.{l}.attn_q.bias"), q)?;
    v.extend(read_vector(files, &format!("blk.{l}.attn_k.bias"), kv)?);
    v.extend(read_vector(files, &format!("blk.{l}.attn_v.bias"), kv)?);
    upload_f32(ks, &v, &format!("blk.{l}.attn_qkv.bias"))
}

impl<B: Backend> DecoderModel<B> {
    /// Uploads every weight, checking each shape against `cfg`, lays the
    /// projections out for the fusion plan, and prepares the kernels.
    pub fn load(ks: &B, files: &ModelFiles, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let (hd, h, hq, hk, inter) = (cfg.head_dim, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.intermediate);
        let spec = &cfg.spec;
        let plan = Fusion::decide(ks, cfg);
        let embed = load_matrix(ks, files, "token_embd.weight", cfg.vocab, h)?;
        let mut thetas: Vec<f64> = Vec::new();
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let norm = |name: &str, len| load_norm(ks, files, cfg, &n(name), len);
            let opt_norm = |on: bool, name: &str, len| on.then(|| norm(name, len)).transpose();
            let qkv = read_qkv(files, l, hq * hd, hk * hd, h, spec.qkv_storage)?;
            let gate_up = read_gate_up(files, l, inter, h, spec.gate_up_storage)?;
            let theta = cfg.rope_theta_of(l);
            let rope = match thetas.iter().position(|&t| t == theta) {
                Some(i) => i,
                None => {
                    thetas.push(theta);
                    thetas.len() - 1
                }
            };
            layers.push(Layer {
                attn_norm: norm("attn_norm", h)?,
                ffn_norm: norm("ffn_norm", h)?,
                qkv: upload_qkv(ks, qkv, l, hd, cfg.rope_pairing, plan.qkv_rope)?,
                o: load_matrix(ks, files, &n("attn_output"), h, hq * hd)?,
                gate_up: upload_gate_up(ks, gate_up, l, plan.gate_up_act)?,
                down: load_matrix(ks, files, &n("ffn_down"), h, inter)?,
                qkv_bias: spec.qkv_bias.then(|| load_qkv_bias(ks, files, cfg, l)).transpose()?,
                q_norm: opt_norm(spec.qk_norm, "attn_q_norm", hd)?,
                k_norm: opt_norm(spec.qk_norm, "attn_k_norm", hd)?,
                post_attn_norm: opt_norm(spec.post_norms, "post_attention_norm", h)?,
                post_ffn_norm: opt_norm(spec.post_norms, "post_ffw_norm", h)?,
                rope,
                window: spec.window(l).map_or(0, |w| w as u32),
            });
        }
        let fusion = plan.settle(layers.iter().all(Layer::has_fused_weights));
        let final_norm = load_norm(ks, files, cfg, "output_norm.weight", h)?;
        let lm_head = if files.has("output.weight") {
            Some(load_matrix(ks, files, "output.weight", cfg.vocab, h)?)
        } else {
            None
        };
        let ropes = thetas
            .iter()
            .map(|&theta| {
                let table = rope_table_scaled(cfg.max_context, hd, theta, cfg.rope_freq_factors.as_deref());
                upload_f32(ks, &table, "rope table")
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Every matrix and vector, the final norm and the rope tables.
        let mut weight_bytes = embed.device_bytes() + lm_head.as_ref().map_or(0, |w| w.device_bytes());
        weight_bytes += ks.buffer_bytes(&final_norm) + ropes.iter().map(|r| ks.buffer_bytes(r)).sum::<u64>();
        for l in &layers {
            for w in l.matrices() {
                weight_bytes += WeightInfo::device_bytes(w);
            }
            for b in l.vectors() {
                weight_bytes += ks.buffer_bytes(b);
            }
        }
        let model = Self {
            cfg: cfg.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            ropes,
            weight_bytes,
            fusion,
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
        if let Some(s) = c.spec.embed_scale {
            ks.elementwise(enc, &b.h, t * hidden, Elementwise::Scale(s))?;
        }
        // With the norms fused, h is the residual stream throughout: the qkv
        // and gate·up gemms normalise it as they read it, o and down add to it.
        // Else `pending` holds the last sublayer's output, not yet added to h.
        let fused = self.fusion.norms;
        let norm = |w| fused.then_some(NormArgs { w, eps });
        let x = Rows::new(if fused { &b.h } else { &b.x }, c.hidden);
        let mut pending: Option<&B::Buffer> = None;
        // A sublayer's output in delta, after its post-norm where the layer has one.
        let post_norm = |enc: &mut B::Step, w: Option<&B::Buffer>| -> Result<&B::Buffer, B::Error> {
            match (w, &b.post) {
                (Some(w), Some(post)) => {
                    ks.rms_norm(enc, Rows::new(&b.delta, c.hidden), w, None, None, eps, t, hidden, post)?;
                    Ok(post)
                }
                _ => Ok(&b.delta),
            }
        };
        for (l, layer) in self.layers.iter().enumerate() {
            // Layer 0 normalises the embeddings; later layers first add the last
            // MLP output to the residual stream h.
            if !fused {
                let (input, residual) = match pending {
                    None => (&b.h, None),
                    Some(p) => (p, Some(&b.h)),
                };
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
            let kv = &f.kv[l];
            let paged = PagedKv {
                k_cache: kv.k,
                v_cache: kv.v,
                dtype: kv.dtype,
                kv_heads: hk,
                head_dim: hd,
                block_size: f.block_size,
                positions: f.positions,
                token_seq: f.token_seq,
                block_tables: kv.block_tables,
                max_blocks: f.max_blocks,
                kv_rows: kv.kv_rows,
                max_query_len: f.max_query_len,
                window: layer.window,
                scale: c
                    .spec
                    .attn_scale
                    .unwrap_or_else(|| PagedKv::<B::Buffer>::default_scale(hd)),
                softcap: c.spec.attn_softcap.unwrap_or(0.0),
            };
            let rope = RopeArgs {
                positions: f.positions,
                table: &self.ropes[layer.rope],
                max_pos: c.max_context as u32,
                pairing: c.rope_pairing,
            };
            let attn_norm = norm(&layer.attn_norm);
            match &layer.qkv {
                QkvWeights::RopeFused(w) => {
                    fused_ops(ks).gemm_rope_kv(enc, w, x, attn_norm, qkv_at(0), rope, paged, hq, kv.slot_mapping, t)?
                }
                QkvWeights::Stacked(w) => ks.gemm(enc, w, x, qkv_at(0), t)?,
                QkvWeights::Split { q, k, v } => {
                    ks.gemm(enc, q, x, qkv_at(0), t)?;
                    ks.gemm(enc, k, x, qkv_at(hq * hd), t)?;
                    ks.gemm(enc, v, x, qkv_at((hq + hk) * hd), t)?;
                }
            }
            if !matches!(layer.qkv, QkvWeights::RopeFused(_)) {
                if let Some(bias) = &layer.qkv_bias {
                    ks.add_bias(enc, qkv_at(0), bias, qkv_w, t)?;
                }
                if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                    ks.head_norm(enc, qkv_at(0), qn, eps, hq, hd, t)?;
                    ks.head_norm(enc, qkv_at(hq * hd), kn, eps, hk, hd, t)?;
                }
                ks.rope_cache_write(enc, &b.qkv, qkv_w, rope, paged, hq, kv.slot_mapping, t)?;
            }
            ks.paged_attention(enc, &b.qkv, qkv_w, paged, hq, t, &b.attn)?;
            let attn = Rows::new(&b.attn, (hq * hd) as usize);
            if fused {
                fused_ops(ks).gemm_residual(enc, &layer.o, attn, Rows::new(&b.h, c.hidden), t)?;
            } else {
                ks.gemm(enc, &layer.o, attn, Rows::new(&b.delta, c.hidden), t)?;
                let out = post_norm(enc, layer.post_attn_norm.as_ref())?;
                let out = Rows::new(out, c.hidden);
                ks.rms_norm(enc, out, &layer.ffn_norm, Some(&b.h), None, eps, t, hidden, &b.x)?;
            }
            let gu_at = |off: u32| Rows {
                buf: &b.gu,
                off,
                stride: 2 * inter,
            };
            match &layer.gate_up {
                GateUpWeights::Interleaved(w) => {
                    let act = Rows::new(&b.act, c.intermediate);
                    fused_ops(ks).gemm_silu_mul(enc, w, x, norm(&layer.ffn_norm), act, t)?;
                }
                GateUpWeights::Stacked(w) => {
                    ks.gemm(enc, w, x, gu_at(0), t)?;
                    ks.act_mul(enc, &b.gu, &b.act, t, inter, c.spec.act)?;
                }
                GateUpWeights::Split { gate, up } => {
                    ks.gemm(enc, gate, x, gu_at(0), t)?;
                    ks.gemm(enc, up, x, gu_at(inter), t)?;
                    ks.act_mul(enc, &b.gu, &b.act, t, inter, c.spec.act)?;
                }
            }
            let act = Rows::new(&b.act, c.intermediate);
            if fused {
                fused_ops(ks).gemm_residual(enc, &layer.down, act, Rows::new(&b.h, c.hidden), t)?;
            } else {
                ks.gemm(enc, &layer.down, act, Rows::new(&b.delta, c.hidden), t)?;
                pending = Some(post_norm(enc, layer.post_ffn_norm.as_ref())?);
            }
        }
        // The last MLP output is in h already where the norms are fused, else pending.
        let (last, residual) = match pending {
            Some(p) if !fused => (p, Some(&b.h)),
            _ => (&b.h, None),
        };
        if f.all_hidden {
            // Every row, normed, into x (free by now); with a residual, h
            // then holds the sum, which the logits rows read as it is.
            ks.rms_norm(
                enc,
                Rows::new(last, c.hidden),
                &self.final_norm,
                residual,
                None,
                eps,
                t,
                hidden,
                &b.x,
            )?;
            ks.rms_norm(
                enc,
                Rows::new(&b.h, c.hidden),
                &self.final_norm,
                None,
                Some(f.logits_rows),
                eps,
                n_rows,
                hidden,
                &b.xf,
            )?;
        } else {
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
        }
        ks.gemm(
            enc,
            self.lm_head(),
            Rows::new(&b.xf, c.hidden),
            Rows::new(&b.logits, c.vocab),
            n_rows,
        )?;
        if let Some(cap) = c.spec.final_softcap {
            ks.elementwise(enc, &b.logits, n_rows * c.vocab as u32, Elementwise::Softcap(cap))?;
        }
        ks.argmax(enc, &b.logits, c.vocab as u32, n_rows, &b.sampled)?;
        Ok(())
    }
}
