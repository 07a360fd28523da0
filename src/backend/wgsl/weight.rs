//! A weight matrix resident on the GPU in the layout of `quant::repack`: in
//! storage buffers, or on CPU adapters as textures, which the gemm and the
//! embedding gather read there (llvmpipe loads a texel for all eight lanes of a vector at once, but
//! a storage element lane by lane: 3x the read rate in a probe). They are
//! bound as read-only storage textures: llvmpipe's image load is inline code,
//! where a sampled texel fetch of a format other than rgba8 calls a generic
//! function that also looks up each lane's mip level (this machine's JIT
//! code: three quarters of a one-row decode step's kernel time in those calls;
//! `read_tex.wgsl` over 4 MiB: 8.4-8.9 GB/s sampled, 16.4-16.6 as storage).

use crate::config::GemmTiles;
use crate::gpu::{Binding, Bound, BufSlice, GpuContext, GpuError};
use crate::quant::{Repacked, WeightFormat};

/// `W[n][k]` on the GPU.
#[derive(Clone, Debug)]
pub struct GpuWeight {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    /// (n, w_row) vec4 elements of the format's layout; `None` where the
    /// textures hold the weight alone (`Residency::Textures`).
    pub data: Option<wgpu::Buffer>,
    /// (n, k/32) f32 or vec2<f32>; quantised formats with `data` only.
    pub scales: Option<wgpu::Buffer>,
    /// The same rows as textures, in windows of at most the adapter's 2D
    /// texture height (CPU adapters only; empty elsewhere).
    pub tex: Vec<WeightTex>,
}

/// Where a weight's rows live on the device: one copy wherever every reader
/// can take it (llama.cpp keeps one; wllm kept both on CPU adapters, 2x the
/// weight bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Storage buffers only (GPUs, and CPU adapters run with GPU shapes).
    Buffers,
    /// Textures in the lane-group layout of `TexLayout`, with no buffers;
    /// where the adapter cannot hold the textures, buffers instead.
    Textures(TexLayout),
    /// Both: for gemm tiles whose passes do not all read the textures, and
    /// for tests that read one weight through both paths.
    Both(TexLayout),
}

/// The lane-group layout of weight textures (see `WeightTex`): the gemm tiles
/// it serves and the most texture rows a window may have (the adapter's 2D
/// limit; tests lower it to get several windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TexLayout {
    pub tiles: GemmTiles,
    pub max_rows: u32,
}

impl TexLayout {
    pub fn new(ctx: &GpuContext, tiles: GemmTiles) -> Self {
        Self {
            tiles,
            max_rows: ctx.limits.max_texture_dimension_2d,
        }
    }
}

/// Rows `row0..row0 + rows` of a weight as textures, laid out for the
/// gemm's workgroups (CPU adapters, `GemmTiles::cpu`): a workgroup's `wg`
/// lanes take `tn` columns each, so rows go in groups of `tn · wg`, and
/// texture row `g · units + u` holds unit `u` (a quantised block, or a float
/// chunk of 8) of every row of group `g`: row `g·tn·wg + l·tn + j` at texel
/// `(j·wg + l)·parts + p` (`p` the unit's texel: Q8_0 and f32 take two). A
/// block step of a workgroup then reads one contiguous run (3 KiB for Q4 at
/// 24 x 8), which the CPU's prefetchers follow, where rows one texel row
/// each were 192 streams. `scales` the same, a texel per block (Q4_1) or per
/// two blocks (`scale_pairs`). Rows past the weight's are zero.
#[derive(Clone, Debug)]
pub struct WeightTex {
    pub row0: u32,
    pub rows: u32,
    /// Columns a lane takes and lanes a workgroup has, the layout's group.
    pub tn: u32,
    pub wg: u32,
    pub data: Bound,
    pub scales: Option<Bound>,
}

pub(super) fn texture(
    ctx: &GpuContext,
    bytes: &[u8],
    width: u32,
    rows: u32,
    format: wgpu::TextureFormat,
    label: &str,
) -> Bound {
    use wgpu::util::DeviceExt;
    let tex = ctx.device.create_texture_with_data(
        &ctx.queue,
        &wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d {
                width,
                height: rows,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format,
            usage: wgpu::TextureUsages::STORAGE_BINDING,
            view_formats: &[],
        },
        wgpu::util::TextureDataOrder::LayerMajor,
        bytes,
    );
    Bound::Tex {
        view: tex.create_view(&wgpu::TextureViewDescriptor::default()),
        bytes: bytes.len() as u64,
    }
}

/// A texture's rows as stored: `row_bytes` bytes of `units` units, in
/// texels of `texel` bytes.
struct RowLayout {
    row_bytes: usize,
    texel: usize,
    units: usize,
}

/// Rows laid out as `rl`, in the lane-group layout of `WeightTex` for the
/// `groups` of `tn · wg` rows.
fn lane_groups(src: &[u8], rl: RowLayout, tn: usize, wg: usize, groups: std::ops::Range<usize>) -> Vec<u8> {
    let RowLayout {
        row_bytes,
        texel,
        units,
    } = rl;
    let (g0, groups) = (groups.start, groups.len());
    let texels = row_bytes / texel;
    let parts = texels / units;
    let gw = tn * wg;
    let rows = src.len() / row_bytes;
    let mut out = vec![0u8; groups * units * parts * gw * texel];
    for g in 0..groups {
        for u in 0..units {
            let line = (g * units + u) * parts * gw * texel;
            for p in 0..parts {
                for j in 0..tn {
                    for l in 0..wg {
                        let row = (g0 + g) * gw + l * tn + j;
                        if row >= rows {
                            continue;
                        }
                        let from = row * row_bytes + (u * parts + p) * texel;
                        let to = line + ((j * wg + l) * parts + p) * texel;
                        out[to..to + texel].copy_from_slice(&src[from..from + texel]);
                    }
                }
            }
        }
    }
    out
}

/// `r` as texture windows in the lane-group layout for `tiles` (see
/// `WeightTex`), where the adapter can hold a group (else none).
fn textures(ctx: &GpuContext, r: &Repacked, label: &str, layout: TexLayout) -> Vec<WeightTex> {
    let (tiles, max_rows) = (layout.tiles, layout.max_rows as usize);
    let max = ctx.limits.max_texture_dimension_2d as usize;
    let data_w = w_row_len(r.format, r.k);
    let (tn, wg) = (tiles.decode_tn as usize, tiles.wg as usize);
    let gw = tn * wg;
    let units = if r.format.is_quantized() {
        r.k / 32
    } else {
        r.k.div_ceil(8)
    };
    if r.n == 0 || units == 0 || !data_w.is_multiple_of(units) {
        return Vec::new();
    }
    let (drb, srb) = (r.data.len() / r.n, r.scales.len() / r.n);
    let pairs = scale_pairs(r.format);
    let scale_format = scale_binding(r.format)
        .texture_format()
        .unwrap_or(wgpu::TextureFormat::R32Float);
    let scale_texel = scale_format.block_copy_size(None).map_or(4, |b| b as usize);
    // Scale pairs: a texel holds blocks 2i and 2i + 1, rows of an odd block
    // count padded with a zero block.
    let scale_units = if pairs { units.div_ceil(2) } else { units };
    let scales: Vec<u8> = if pairs && units % 2 == 1 {
        let padded = srb + srb / units;
        r.scales
            .chunks(srb)
            .flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(0, padded - srb)))
            .collect()
    } else {
        r.scales.clone()
    };
    let parts = data_w / units;
    let height = units.max(if r.format.is_quantized() { scale_units } else { 1 });
    let groups_per_window = max.min(max_rows) / height;
    if groups_per_window == 0 || parts * gw > max {
        return Vec::new();
    }
    let groups = r.n.div_ceil(gw);
    (0..groups)
        .step_by(groups_per_window)
        .map(|g0| {
            let ng = groups_per_window.min(groups - g0);
            let rl = RowLayout {
                row_bytes: drb,
                texel: 16,
                units,
            };
            let data = lane_groups(&r.data, rl, tn, wg, g0..g0 + ng);
            WeightTex {
                row0: (g0 * gw) as u32,
                rows: (ng * gw).min(r.n - g0 * gw) as u32,
                tn: tn as u32,
                wg: wg as u32,
                data: texture(
                    ctx,
                    &data,
                    (parts * gw) as u32,
                    (ng * units) as u32,
                    wgpu::TextureFormat::Rgba32Uint,
                    label,
                ),
                scales: r.format.is_quantized().then(|| {
                    let srb = scales.len() / r.n;
                    let rl = RowLayout {
                        row_bytes: srb,
                        texel: scale_texel,
                        units: scale_units,
                    };
                    let s = lane_groups(&scales, rl, tn, wg, g0..g0 + ng);
                    texture(ctx, &s, gw as u32, (ng * scale_units) as u32, scale_format, label)
                }),
            }
        })
        .collect()
}

/// Whether a format's scale texture holds two blocks a texel (gemm.wgsl's
/// `pairs`: one fetch serves two blocks): Q8_0 (lavapipe, `wllm profile`:
/// the lm_head's Q8_0 gemm at one row 5.0 -> 4.1 ms). Q4_1's (d, m) pairs
/// stay a texel a block: four floats a texel fetched no faster than two
/// twice. Q4_0 too: its 24 columns' pair texels, live across both blocks of
/// a step, cost more than the fetch they save (`cargo bench --bench
/// kernels`, 576→49152 at one row, three interleaved runs: 8.48 / 8.21 /
/// 8.54 G weights/s paired, 8.96 / 9.10 / 9.59 a texel a block).
pub fn scale_pairs(format: WeightFormat) -> bool {
    matches!(format, WeightFormat::Q8_0)
}

/// `w` array elements (vec4) per weight row (narrow layouts: u32 words, their `w` being u32s).
pub fn w_row_len(format: WeightFormat, k: usize) -> usize {
    let kp = k.div_ceil(8) * 8;
    match format.layout() {
        f if f.is_narrow() => format.row_bytes(k).0 / 4,
        WeightFormat::F32 => kp / 4,
        WeightFormat::F16 | WeightFormat::Bf16 => kp / 8,
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => k / 32,
        _ => k / 32 * 2,
    }
}

/// How the gemm binds a format's scale texture (its texel format rendered into
/// weights.wgsl's `tex_bindings` as `scale_texel`):
/// rg32float for Q4_1's (d, m) and for the d pairs of Q8_0,
/// rgba32float for Q8_16's (d0, m0, d1, m1), else r32float.
pub fn scale_binding(format: WeightFormat) -> Binding {
    match (format.scale_floats(), scale_pairs(format)) {
        (1, true) | (2, _) => Binding::LoadRg32Float,
        (4, _) => Binding::LoadRgba32Float,
        _ => Binding::LoadR32Float,
    }
}

impl GpuWeight {
    /// Uploads a repacked matrix as buffers, and on CPU adapters also as
    /// textures for `GemmTiles::cpu` (both paths readable: tests).
    pub fn upload(ctx: &GpuContext, r: &Repacked, label: &str) -> Self {
        let residency = if ctx.cpu_textures() {
            Residency::Both(TexLayout::new(ctx, GemmTiles::cpu()))
        } else {
            Residency::Buffers
        };
        Self::upload_as(ctx, r, label, residency)
    }

    /// Uploads a repacked matrix where `residency` says.
    /// Narrow layouts are buffers whatever `residency` says (they have no texture layout).
    pub fn upload_as(ctx: &GpuContext, r: &Repacked, label: &str, residency: Residency) -> Self {
        let residency = if r.format.is_narrow() {
            Residency::Buffers
        } else {
            residency
        };
        let tex = match residency {
            Residency::Buffers => Vec::new(),
            Residency::Textures(l) | Residency::Both(l) => textures(ctx, r, label, l),
        };
        let buffers = tex.is_empty() || matches!(residency, Residency::Both(_));
        let mk = |bytes: &[u8]| ctx.storage_buffer(bytes, label);
        Self {
            format: r.format,
            n: r.n,
            k: r.k,
            data: buffers.then(|| mk(&r.data)),
            scales: (buffers && r.format.is_quantized()).then(|| mk(&r.scales)),
            tex,
        }
    }

    /// Texels a unit (block or float chunk) of a row takes in a texture row
    /// (`WeightTex`'s `parts`): 2 for F32 and Q8_0, else 1.
    pub fn tex_parts(&self) -> u32 {
        (self.w_row() / self.chunks().max(1)) as u32
    }

    /// `w` array elements per row (see gemm.wgsl).
    pub fn w_row(&self) -> usize {
        w_row_len(self.format, self.k)
    }

    /// 8-element chunks (floats) or 32-element blocks (quantised) per row.
    pub fn chunks(&self) -> usize {
        if self.format.is_quantized() {
            self.k / 32
        } else {
            self.k.div_ceil(8)
        }
    }

    /// Splits the rows into windows that each bind within `max_binding` bytes at
    /// offsets aligned to `align`: (first row, rows, data slice, scales slice).
    /// Every window but the last holds an even number of rows.
    pub fn windows(&self, max_binding: u64, align: u64) -> Result<Vec<WeightWindow>, GpuError> {
        let Some(data) = &self.data else {
            return Err(GpuError::Limit(format!(
                "a {:?} weight of {} x {} is held as textures only, laid out for other gemm tiles: \
                 upload it with the kernels that read it",
                self.format, self.n, self.k
            )));
        };
        let (drb, srb) = self.format.row_bytes(self.k);
        let (drb, srb) = (drb as u64, srb as u64);
        let fits = self.n as u64 * drb <= max_binding && (self.scales.is_none() || self.n as u64 * srb <= max_binding);
        if fits {
            return Ok(vec![WeightWindow {
                row0: 0,
                rows: self.n as u32,
                data: BufSlice::whole(data),
                scales: self.scales.as_ref().map(BufSlice::whole),
            }]);
        }
        let step_for = |rb: u64| align / gcd(align, rb.max(1));
        // Even rows per window: a window never splits an interleaved gate/up pair.
        let step = lcm(
            lcm(step_for(drb), if self.scales.is_some() { step_for(srb) } else { 1 }),
            2,
        );
        let max_rows = max_binding / drb.max(if self.scales.is_some() { srb } else { 1 });
        let rows = max_rows / step * step;
        if rows == 0 {
            return Err(GpuError::Limit(format!(
                "a {:?} weight row of {drb} bytes cannot be bound within the adapter's {max_binding}-byte limit",
                self.format
            )));
        }
        let mut out = Vec::new();
        let mut row0 = 0u64;
        while row0 < self.n as u64 {
            let r = rows.min(self.n as u64 - row0);
            out.push(WeightWindow {
                row0: row0 as u32,
                rows: r as u32,
                data: BufSlice::range(data, row0 * drb, r * drb),
                scales: self
                    .scales
                    .as_ref()
                    .map(|s| BufSlice::range(s, row0 * srb, (r * srb).div_ceil(4) * 4)),
            });
            row0 += r;
        }
        Ok(out)
    }

    /// Bytes this weight occupies on the GPU (buffers and textures).
    pub fn gpu_bytes(&self) -> u64 {
        let tex: u64 = self
            .tex
            .iter()
            .map(|t| t.data.len() + t.scales.as_ref().map_or(0, |s| s.len()))
            .sum();
        self.data.as_ref().map_or(0, |d| d.size()) + self.scales.as_ref().map_or(0, |s| s.size()) + tex
    }

    /// Bytes of the weight as stored (what a decode step must read).
    pub fn stored_bytes(&self) -> usize {
        self.format.stored_bytes(self.n, self.k)
    }
}

/// A run of rows of a weight, bound on its own (see `GpuWeight::windows`).
#[derive(Clone, Debug)]
pub struct WeightWindow {
    pub row0: u32,
    pub rows: u32,
    pub data: BufSlice,
    pub scales: Option<BufSlice>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every texel of every row lands where gemm.wgsl reads it: row
    /// `g·tn·wg + l·tn + j`, unit `u`, part `p` at texture row `g·units + u`,
    /// texel `(j·wg + l)·parts + p`; the last group's missing rows are zero.
    #[test]
    fn lane_groups_put_each_texel_where_the_gemm_reads_it() {
        let (tn, wg, units, parts, texel) = (3usize, 2usize, 5usize, 2usize, 4usize);
        let rows = 2 * tn * wg + 4; // three groups, the last short of two rows
        let row_bytes = units * parts * texel;
        // Each texel's bytes name its row, unit and part.
        let src: Vec<u8> = (0..rows)
            .flat_map(|r| (0..units * parts).flat_map(move |t| [r as u8, (t / parts) as u8, (t % parts) as u8, 1]))
            .collect();
        let rl = RowLayout {
            row_bytes,
            texel,
            units,
        };
        let out = lane_groups(&src, rl, tn, wg, 1..3);
        let width = parts * tn * wg;
        assert_eq!(out.len(), 2 * units * width * texel);
        for g in 0..2 {
            for u in 0..units {
                for j in 0..tn {
                    for l in 0..wg {
                        for p in 0..parts {
                            let at = ((g * units + u) * width + (j * wg + l) * parts + p) * texel;
                            let row = (1 + g) * tn * wg + l * tn + j;
                            let want = if row < rows {
                                [row as u8, u as u8, p as u8, 1]
                            } else {
                                [0; 4]
                            };
                            assert_eq!(
                                out[at..at + texel],
                                want,
                                "group {g} unit {u} lane {l} column {j} part {p}"
                            );
                        }
                    }
                }
            }
        }
    }
}
