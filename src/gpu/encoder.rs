//! Records one step's work (dispatches and copies) and submits it: a first
//! command buffer of an eighth of its dispatches, then the rest, so that the
//! adapter starts while the CPU encodes (`submit_parts`).
//!
//! Each dispatch's parameters are packed into one uniform buffer per step at
//! aligned offsets, bound with a dynamic offset. Bind groups are made at submit
//! time, or, with a `BindCache` (the engine's steps, whose buffers live as long
//! as the engine), made once and reused: the parameters then go to a buffer the
//! cache keeps, and a step only writes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{GpuContext, GpuError, Kernel};

/// A byte range of a buffer to bind or read.
#[derive(Clone, Debug)]
pub struct BufSlice {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    /// `None`: to the end of the buffer.
    pub size: Option<u64>,
}

impl BufSlice {
    pub fn whole(buffer: &wgpu::Buffer) -> Self {
        Self {
            buffer: buffer.clone(),
            offset: 0,
            size: None,
        }
    }
    pub fn range(buffer: &wgpu::Buffer, offset: u64, size: u64) -> Self {
        Self {
            buffer: buffer.clone(),
            offset,
            size: Some(size),
        }
    }
    /// Bytes of the slice.
    pub fn len(&self) -> u64 {
        self.size.unwrap_or(self.buffer.size() - self.offset)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<&wgpu::Buffer> for BufSlice {
    fn from(b: &wgpu::Buffer) -> Self {
        Self::whole(b)
    }
}

/// A resource bound after the parameters: a buffer range, or a texture read
/// with `textureLoad` (`bytes`: its size, for the profiler's byte counts).
#[derive(Clone, Debug)]
pub enum Bound {
    Buf(BufSlice),
    Tex { view: wgpu::TextureView, bytes: u64 },
}

impl Bound {
    /// Bytes of the buffer range or texture.
    pub fn len(&self) -> u64 {
        match self {
            Self::Buf(b) => b.len(),
            Self::Tex { bytes, .. } => *bytes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<BufSlice> for Bound {
    fn from(b: BufSlice) -> Self {
        Self::Buf(b)
    }
}

/// The bind-cache identity of a `Bound`.
#[derive(Clone, PartialEq, Eq, Hash)]
enum BoundKey {
    Buf(wgpu::Buffer, u64, Option<u64>),
    Tex(wgpu::TextureView),
}

#[derive(Clone)]
enum Op {
    Dispatch {
        kernel: Arc<Kernel>,
        params: (u64, u64),
        bufs: Vec<Bound>,
        groups: [u32; 3],
    },
    Copy {
        src: BufSlice,
        dst: BufSlice,
    },
    /// `rows` rows of `width` 16-byte texels from `src` (rows `width * 16` bytes apart).
    CopyToTexture {
        src: BufSlice,
        dst: wgpu::Texture,
        width: u32,
        rows: u32,
    },
}

/// What identifies a bind group: the kernel, the parameter slice length and the
/// storage bindings.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    kernel: usize,
    params_len: u64,
    bufs: Vec<BoundKey>,
}

/// Bind groups kept across steps, with the parameter buffer they bind. Holding
/// a bind group keeps its buffers alive, so a cache belongs to one owner of
/// long-lived buffers (an engine's backend) and is cleared past `CAPACITY`.
#[derive(Default)]
pub struct BindCache {
    params: Option<wgpu::Buffer>,
    // The kernel is kept with its bind group so that the address in the key stays its own.
    groups: HashMap<BindKey, (Arc<Kernel>, wgpu::BindGroup)>,
    /// Bind groups made (misses) and reused (hits), for tests and tuning.
    pub made: u64,
    pub reused: u64,
}

impl BindCache {
    const CAPACITY: usize = 16384;

    pub fn shared() -> Arc<Mutex<BindCache>> {
        Arc::new(Mutex::new(Self::default()))
    }
}

/// One step's command stream.
pub struct StepEncoder {
    ctx: GpuContext,
    params: Vec<u8>,
    ops: Vec<Op>,
    cache: Option<Arc<Mutex<BindCache>>>,
}

impl StepEncoder {
    pub fn new(ctx: &GpuContext) -> Self {
        Self {
            ctx: ctx.clone(),
            params: Vec::new(),
            ops: Vec::new(),
            cache: None,
        }
    }

    /// A step whose bind groups are kept in (and taken from) `cache`.
    pub fn with_cache(ctx: &GpuContext, cache: Arc<Mutex<BindCache>>) -> Self {
        Self {
            cache: Some(cache),
            ..Self::new(ctx)
        }
    }

    /// Records `kernel` over `groups` workgroups with `params` at binding 0 and
    /// `bufs` at bindings 1.. . Zero-sized dispatches are dropped.
    pub fn dispatch(&mut self, kernel: &Arc<Kernel>, params: &[u8], bufs: &[BufSlice], groups: [u32; 3]) {
        let bound: Vec<Bound> = bufs.iter().cloned().map(Bound::Buf).collect();
        self.dispatch_bound(kernel, params, bound, groups);
    }

    /// As `dispatch`, with textures among the bindings.
    pub fn dispatch_bound(&mut self, kernel: &Arc<Kernel>, params: &[u8], bufs: Vec<Bound>, groups: [u32; 3]) {
        debug_assert_eq!(bufs.len(), kernel.storage.len(), "{}", kernel.name);
        if groups.contains(&0) {
            return;
        }
        let align = u64::from(self.ctx.limits.min_uniform_buffer_offset_alignment).max(16);
        let off = (self.params.len() as u64).div_ceil(align) * align;
        self.params.resize(off as usize, 0);
        self.params.extend_from_slice(params);
        // Uniform bindings are at least 16 bytes.
        let len = (params.len() as u64).max(16).div_ceil(16) * 16;
        self.params.resize((off + len) as usize, 0);
        self.ops.push(Op::Dispatch {
            kernel: kernel.clone(),
            params: (off, len),
            bufs,
            groups,
        });
    }

    /// The recorded dispatches grouped by kernel, in first-use order: each
    /// group's kernel and a step of only its dispatches (with their parameters),
    /// so that a profiler can time each kernel's share of a step alone.
    pub fn split_by_kernel(&self) -> Vec<(Arc<Kernel>, StepEncoder)> {
        let mut groups: Vec<(Arc<Kernel>, StepEncoder)> = Vec::new();
        for op in &self.ops {
            let Op::Dispatch {
                kernel,
                params: (off, len),
                bufs,
                groups: g,
            } = op
            else {
                continue;
            };
            let at = match groups.iter().position(|(k, _)| Arc::ptr_eq(k, kernel)) {
                Some(i) => i,
                None => {
                    groups.push((kernel.clone(), StepEncoder::new(&self.ctx)));
                    groups.len() - 1
                }
            };
            let params = &self.params[*off as usize..(*off + *len) as usize];
            groups[at].1.dispatch_bound(kernel, params, bufs.clone(), *g);
        }
        groups
    }

    /// The recorded copies alone (buffer to buffer, buffer to texture) as a
    /// step of their own, with their count and bytes: the profiler's row for
    /// what a step moves outside its kernels.
    pub fn copies(&self) -> (usize, u64, StepEncoder) {
        let mut step = StepEncoder::new(&self.ctx);
        let mut bytes = 0;
        for op in &self.ops {
            if let Op::Copy { src, .. } | Op::CopyToTexture { src, .. } = op {
                bytes += src.len();
                step.ops.push(op.clone());
            }
        }
        (step.ops.len(), bytes, step)
    }

    /// (uniform parameters, bound resources, workgroups) of each dispatch.
    pub fn dispatches(&self) -> impl Iterator<Item = (&[u8], &[Bound], [u32; 3])> {
        self.ops.iter().filter_map(|op| match op {
            Op::Dispatch {
                params: (off, len),
                bufs,
                groups,
                ..
            } => Some((
                &self.params[*off as usize..(*off + *len) as usize],
                bufs.as_slice(),
                *groups,
            )),
            Op::Copy { .. } | Op::CopyToTexture { .. } => None,
        })
    }

    /// Records a buffer-to-buffer copy of `src.len()` bytes.
    pub fn copy(&mut self, src: BufSlice, dst: BufSlice) {
        self.ops.push(Op::Copy { src, dst });
    }

    /// Records a copy of `rows` rows of `width` 16-byte texels from `src` into
    /// the top of `dst` (`width * 16` must be a multiple of 256, `src.offset` of 16).
    pub fn copy_to_texture(&mut self, src: BufSlice, dst: &wgpu::Texture, width: u32, rows: u32) {
        if rows > 0 {
            self.ops.push(Op::CopyToTexture {
                src,
                dst: dst.clone(),
                width,
                rows,
            });
        }
    }

    /// The op index where the step's first command buffer ends: after an
    /// eighth of its dispatches (none for short steps). Submitting that part
    /// first lets the adapter start on it while the rest is encoded and
    /// submitted (see `submit_parts`).
    fn first_part_end(&self) -> usize {
        let dispatches = self.ops.iter().filter(|o| matches!(o, Op::Dispatch { .. })).count();
        if dispatches < Self::SPLIT_FROM {
            return 0;
        }
        let want = dispatches / Self::FIRST_PART_SHARE;
        let mut seen = 0;
        for (i, op) in self.ops.iter().enumerate() {
            if matches!(op, Op::Dispatch { .. }) {
                seen += 1;
                if seen == want {
                    return i + 1;
                }
            }
        }
        0
    }

    /// Steps of at least this many dispatches are submitted in two parts.
    const SPLIT_FROM: usize = 16;
    /// The first part's share of the dispatches (1 / this).
    const FIRST_PART_SHARE: usize = 8;

    /// Encodes and submits the step: its parameters written once, then its
    /// ops as two command buffers, the first (an eighth of the dispatches)
    /// submitted before the second is encoded, so the adapter runs it while
    /// the CPU encodes and submits the rest (wgpu's submit of a 154-dispatch
    /// decode step took 1.3-2.2 ms on lavapipe, during which the adapter had
    /// nothing to run). `tail` adds the last commands (readback copies) to the
    /// last buffer. Queue order keeps the ops in order.
    fn submit_parts(self, tail: impl FnOnce(&mut wgpu::CommandEncoder)) -> GpuContext {
        let device = &self.ctx.device;
        let mut cache = self.cache.as_ref().map(|c| c.lock().unwrap_or_else(|e| e.into_inner()));
        let step_params = match cache.as_deref_mut() {
            // The cache's parameter buffer, grown (and its bind groups dropped) when short.
            Some(c) => {
                let need = (self.params.len() as u64).max(256);
                if c.params.as_ref().is_none_or(|p| p.size() < need) {
                    c.groups.clear();
                    c.params = Some(self.params_buffer(need.next_power_of_two()));
                }
                c.params.clone()
            }
            None => (!self.params.is_empty()).then(|| self.params_buffer(self.params.len() as u64)),
        };
        if let Some(p) = &step_params
            && !self.params.is_empty()
        {
            self.ctx.queue.write_buffer(p, 0, &self.params);
        }
        if let Some(c) = cache.as_deref_mut()
            && c.groups.len() > BindCache::CAPACITY
        {
            c.groups.clear();
        }
        let split = self.first_part_end();
        if split > 0 {
            let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
            self.encode_ops(0..split, &mut enc, step_params.as_ref(), cache.as_deref_mut());
            self.ctx.queue.submit([enc.finish()]);
        }
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        self.encode_ops(
            split..self.ops.len(),
            &mut enc,
            step_params.as_ref(),
            cache.as_deref_mut(),
        );
        tail(&mut enc);
        self.ctx.queue.submit([enc.finish()]);
        drop(cache);
        self.ctx
    }

    /// Encodes `self.ops[range]` into `enc`: copies as copies, each run of
    /// dispatches as one compute pass (bind groups from `cache` where kept).
    fn encode_ops(
        &self,
        range: std::ops::Range<usize>,
        enc: &mut wgpu::CommandEncoder,
        step_params: Option<&wgpu::Buffer>,
        mut cache: Option<&mut BindCache>,
    ) {
        let device = &self.ctx.device;
        let mut i = range.start;
        while i < range.end {
            match &self.ops[i] {
                Op::Copy { src, dst } => {
                    enc.copy_buffer_to_buffer(&src.buffer, src.offset, &dst.buffer, dst.offset, src.len());
                    i += 1;
                }
                Op::CopyToTexture { src, dst, width, rows } => {
                    enc.copy_buffer_to_texture(
                        wgpu::TexelCopyBufferInfo {
                            buffer: &src.buffer,
                            layout: wgpu::TexelCopyBufferLayout {
                                offset: src.offset,
                                bytes_per_row: Some(width * 16),
                                rows_per_image: None,
                            },
                        },
                        wgpu::TexelCopyTextureInfo {
                            texture: dst,
                            mip_level: 0,
                            origin: wgpu::Origin3d::ZERO,
                            aspect: wgpu::TextureAspect::All,
                        },
                        wgpu::Extent3d {
                            width: *width,
                            height: *rows,
                            depth_or_array_layers: 1,
                        },
                    );
                    i += 1;
                }
                Op::Dispatch { .. } => {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: None,
                    });
                    while let Some(Op::Dispatch {
                        kernel,
                        params: (off, len),
                        bufs,
                        groups,
                    }) = self.ops.get(i).filter(|_| i < range.end)
                    {
                        let pbuf = step_params.expect("dispatches carry params");
                        let make = || {
                            let mut entries = vec![wgpu::BindGroupEntry {
                                binding: 0,
                                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer: pbuf,
                                    offset: 0,
                                    size: std::num::NonZeroU64::new(*len),
                                }),
                            }];
                            for (j, b) in bufs.iter().enumerate() {
                                entries.push(wgpu::BindGroupEntry {
                                    binding: j as u32 + 1,
                                    resource: match b {
                                        Bound::Buf(b) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                            buffer: &b.buffer,
                                            offset: b.offset,
                                            size: b.size.and_then(std::num::NonZeroU64::new),
                                        }),
                                        Bound::Tex { view, .. } => wgpu::BindingResource::TextureView(view),
                                    },
                                });
                            }
                            device.create_bind_group(&wgpu::BindGroupDescriptor {
                                label: None,
                                layout: &kernel.layout,
                                entries: &entries,
                            })
                        };
                        let bg = match cache.as_deref_mut() {
                            Some(c) => {
                                let key = BindKey {
                                    kernel: Arc::as_ptr(kernel) as usize,
                                    params_len: *len,
                                    bufs: bufs
                                        .iter()
                                        .map(|b| match b {
                                            Bound::Buf(b) => BoundKey::Buf(b.buffer.clone(), b.offset, b.size),
                                            Bound::Tex { view, .. } => BoundKey::Tex(view.clone()),
                                        })
                                        .collect(),
                                };
                                if let Some((_, bg)) = c.groups.get(&key) {
                                    c.reused += 1;
                                    bg.clone()
                                } else {
                                    c.made += 1;
                                    let bg = make();
                                    c.groups.insert(key, (kernel.clone(), bg.clone()));
                                    bg
                                }
                            }
                            None => make(),
                        };
                        pass.set_pipeline(&kernel.pipeline);
                        pass.set_bind_group(0, &bg, &[*off as u32]);
                        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                        i += 1;
                    }
                }
            }
        }
    }

    fn params_buffer(&self, size: u64) -> wgpu::Buffer {
        self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step params"),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Submits without waiting.
    pub fn submit(self) {
        self.submit_parts(|_| {});
    }

    /// Submits, waits, and returns the bytes of each slice in `reads`.
    pub fn submit_and_read(self, reads: &[BufSlice]) -> Result<Vec<Vec<u8>>, GpuError> {
        let mut staging = Vec::new();
        let device = self.ctx.device.clone();
        let ctx = self.submit_parts(|enc| {
            for r in reads {
                let size = r.len().div_ceil(4) * 4;
                let s = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: size.max(4),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if size > 0 {
                    enc.copy_buffer_to_buffer(&r.buffer, r.offset, &s, 0, size);
                }
                staging.push((s, r.len()));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, (s, _)) in staging.iter().enumerate() {
            let tx = tx.clone();
            s.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send((i, r));
            });
        }
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        // A buffer this step could not get (out of memory) fails the step.
        if let Some(e) = ctx.take_error() {
            return Err(e);
        }
        drop(tx);
        for (_, r) in rx.iter() {
            r.map_err(|e| GpuError::Readback(e.to_string()))?;
        }
        let mut out = Vec::with_capacity(staging.len());
        for (s, len) in staging {
            let view = s
                .slice(..)
                .get_mapped_range()
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            out.push(view[..len as usize].to_vec());
            drop(view);
            s.unmap();
        }
        Ok(out)
    }
}
