//! A small random-weight Llama written as a real GGUF file (GQA, two layers,
//! every weight format among its matrices) for engine tests that must be fast
//! on lavapipe.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rand::Rng;
use rand::rngs::StdRng;
use wllm::quant::WeightFormat;

pub struct TinySpec {
    /// `general.architecture`: llama, qwen2, qwen3, gemma2, gemma3 or phi3
    /// (each family's extra tensors and keys are written).
    pub arch: &'static str,
    /// `{arch}.attention.sliding_window` (0: none).
    pub sliding_window: u32,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub inter: usize,
    pub context: usize,
    /// Llama 3 style `rope_freqs.weight` divisors (head_dim / 2 of them).
    pub rope_freqs: Option<Vec<f32>>,
    /// The matrices' formats: matrix i of layer l gets `formats[(8l + i) % len]`
    pub formats: Vec<WeightFormat>,
    /// Write every matrix as F32 holding its quantised values (the f32 twin of
    /// the same spec and seed).
    pub f32_twin: bool,
    /// `tokenizer.chat_template` (None: a ChatML template).
    pub chat_template: Option<String>,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            arch: "llama",
            sliding_window: 0,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            inter: 128,
            context: 1024,
            rope_freqs: None,
            formats: vec![
                WeightFormat::Q8_0,
                WeightFormat::Q4_0,
                WeightFormat::F16,
                WeightFormat::Q4_1,
                WeightFormat::F32,
                WeightFormat::Bf16,
                WeightFormat::Q8_0,
            ],
            f32_twin: false,
            chat_template: None,
        }
    }
}

enum Val {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn quantize(format: WeightFormat, v: &[f32], k: usize) -> Vec<u8> {
    let mut out = Vec::new();
    match format {
        WeightFormat::IQ4_NL | WeightFormat::IQ4_XS => return iq4(format, v),
        f if f.block().0 == 256 || matches!(f, WeightFormat::Q5_0 | WeightFormat::Q5_1) => {
            return wllm::quant::quantize::quantize(f, v, v.len() / k, k).expect("quantize");
        }
        WeightFormat::F32 => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        WeightFormat::F16 => v.iter().for_each(|x| out.extend(f16::from_f32(*x).to_le_bytes())),
        WeightFormat::Bf16 => v.iter().for_each(|x| out.extend(bf16::from_f32(*x).to_le_bytes())),
        WeightFormat::Q8_0 => {
            for blk in v.chunks(32) {
                let amax = blk.iter().fold(0f32, |a, x| a.max(x.abs()));
                let d = amax / 127.0;
                out.extend(f16::from_f32(d).to_le_bytes());
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                blk.iter()
                    .for_each(|x| out.push((x * id).round().clamp(-127.0, 127.0) as i8 as u8));
            }
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            for blk in v.chunks(32) {
                let (lo, hi) = blk.iter().fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                let (d, m) = if format == WeightFormat::Q4_1 {
                    ((hi - lo) / 15.0, lo)
                } else {
                    (hi.abs().max(lo.abs()) / 8.0, -8.0 * 0.0)
                };
                out.extend(f16::from_f32(d).to_le_bytes());
                if format == WeightFormat::Q4_1 {
                    out.extend(f16::from_f32(m).to_le_bytes());
                }
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = |x: f32| -> u8 {
                    if format == WeightFormat::Q4_1 {
                        ((x - m) * id).round().clamp(0.0, 15.0) as u8
                    } else {
                        (x * id + 8.0).round().clamp(0.0, 15.0) as u8
                    }
                };
                for j in 0..16 {
                    out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
                }
            }
        }
        other => panic!("the tiny model writer has no {other:?} quantiser"),
    }
    out
}

/// IQ4_NL / IQ4_XS blocks (wllm writes neither): each value to its nearest
/// code-book entry under a max-based scale; enough for a model that loads.
fn iq4(format: WeightFormat, v: &[f32]) -> Vec<u8> {
    use wllm::quant::blocks::IQ4_VALUES;
    let nearest = |x: f32| -> u8 {
        (0..16)
            .min_by(|&a, &b| {
                (x - f32::from(IQ4_VALUES[a]))
                    .abs()
                    .total_cmp(&(x - f32::from(IQ4_VALUES[b])).abs())
            })
            .unwrap_or(0) as u8
    };
    let pack = |sub: &[f32], d: f32, out: &mut Vec<u8>| {
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend((0..16).map(|j| nearest(sub[j] * id) | (nearest(sub[j + 16] * id) << 4)));
    };
    let amax = |s: &[f32]| s.iter().fold(0f32, |a, x| a.max(x.abs()));
    let mut out = Vec::new();
    if format == WeightFormat::IQ4_NL {
        for sub in v.chunks(32) {
            let d = f16::from_f32(amax(sub) / 127.0);
            out.extend(d.to_le_bytes());
            pack(sub, d.to_f32(), &mut out);
        }
        return out;
    }
    for sb in v.chunks(256) {
        let d = f16::from_f32(amax(sb) / 127.0 / 31.0);
        let ls: Vec<u8> = sb
            .chunks(32)
            .map(|s| ((amax(s) / 127.0 / d.to_f32()).round() as i32 + 32).clamp(0, 63) as u8)
            .collect();
        out.extend(d.to_le_bytes());
        let sh = ls
            .iter()
            .enumerate()
            .fold(0u16, |a, (i, &l)| a | (u16::from(l >> 4) << (2 * i)));
        out.extend(sh.to_le_bytes());
        out.extend((0..4).map(|i| (ls[2 * i] & 0xF) | ((ls[2 * i + 1] & 0xF) << 4)));
        for (s, &l) in sb.chunks(32).zip(&ls) {
            pack(s, d.to_f32() * (i32::from(l) - 32) as f32, &mut out);
        }
    }
    out
}

fn ggml_type(f: WeightFormat) -> u32 {
    f.ggml_type().expect("a stored format")
}

/// Writes the tiny model to `dir/name` and returns its path. `vocab` is 260.
pub fn write_tiny_gguf(dir: &Path, name: &str, spec: &TinySpec, r: &mut StdRng) -> PathBuf {
    let hd = spec.hidden / spec.heads;
    let chars = wllm::tokenizer::byte_level_chars();
    let mut tokens: Vec<String> = (0..256).map(|b| chars[b].to_string()).collect();
    tokens.extend(["<|im_start|>", "<|im_end|>", "Ġt", "he"].map(String::from));
    let vocab = tokens.len();
    let mut types = vec![1i32; vocab];
    types[256] = 3;
    types[257] = 3;
    let a = spec.arch;
    let key = |k: &str| format!("{a}.{k}");
    let mut arch_kv: Vec<(String, Val)> = vec![
        (key("block_count"), Val::U32(spec.layers as u32)),
        (key("context_length"), Val::U32(spec.context as u32)),
        (key("embedding_length"), Val::U32(spec.hidden as u32)),
        (key("feed_forward_length"), Val::U32(spec.inter as u32)),
        (key("attention.head_count"), Val::U32(spec.heads as u32)),
        (key("attention.head_count_kv"), Val::U32(spec.kv_heads as u32)),
        (
            key("rope.freq_base"),
            Val::F32(if a == "gemma3" { 1_000_000.0 } else { 10000.0 }),
        ),
        (key("attention.layer_norm_rms_epsilon"), Val::F32(1e-5)),
        (key("vocab_size"), Val::U32(vocab as u32)),
    ];
    if spec.sliding_window > 0 {
        arch_kv.push((key("attention.sliding_window"), Val::U32(spec.sliding_window)));
    }
    if a == "gemma2" {
        arch_kv.push((key("attn_logit_softcapping"), Val::F32(1.5)));
        arch_kv.push((key("final_logit_softcapping"), Val::F32(2.5)));
    }
    let common: Vec<(&str, Val)> = vec![
        ("general.architecture", Val::Str(a.into())),
        ("tokenizer.ggml.model", Val::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Val::Str("default".into())),
        ("tokenizer.ggml.tokens", Val::StrArr(tokens)),
        ("tokenizer.ggml.token_type", Val::I32Arr(types)),
        ("tokenizer.ggml.merges", Val::StrArr(vec!["Ġ t".into(), "h e".into()])),
        ("tokenizer.ggml.bos_token_id", Val::U32(256)),
        ("tokenizer.ggml.eos_token_id", Val::U32(257)),
        ("tokenizer.ggml.add_bos_token", Val::Bool(false)),
        (
            "tokenizer.chat_template",
            Val::Str(spec.chat_template.clone().unwrap_or_else(|| "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into())),
        ),
    ];
    let mut kv = arch_kv;
    kv.extend(common.into_iter().map(|(k, v)| (k.to_string(), v)));
    let (h, q) = (spec.hidden, spec.heads * hd);
    let kvw = spec.kv_heads * hd;
    let mut tensors: Vec<(String, Vec<usize>, WeightFormat)> =
        vec![("token_embd.weight".into(), vec![h, vocab], WeightFormat::Q8_0)];
    let formats = &spec.formats;
    let gemma = a.starts_with("gemma");
    for l in 0..spec.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        tensors.push((n("attn_norm"), vec![h], WeightFormat::F32));
        tensors.push((n("ffn_norm"), vec![h], WeightFormat::F32));
        if a == "qwen2" {
            for (t, w) in [("attn_q", q), ("attn_k", kvw), ("attn_v", kvw)] {
                tensors.push((format!("blk.{l}.{t}.bias"), vec![w], WeightFormat::F32));
            }
        }
        if a == "qwen3" || a == "gemma3" {
            tensors.push((n("attn_q_norm"), vec![hd], WeightFormat::F32));
            tensors.push((n("attn_k_norm"), vec![hd], WeightFormat::F32));
        }
        if gemma {
            tensors.push((n("post_attention_norm"), vec![h], WeightFormat::F32));
            tensors.push((n("post_ffw_norm"), vec![h], WeightFormat::F32));
        }
        let mats: Vec<(&str, usize, usize)> = if a == "phi3" {
            vec![
                ("attn_qkv", h, q + 2 * kvw),
                ("attn_output", q, h),
                ("ffn_up", h, 2 * spec.inter),
                ("ffn_down", spec.inter, h),
            ]
        } else {
            vec![
                ("attn_q", h, q),
                ("attn_k", h, kvw),
                ("attn_v", h, kvw),
                ("attn_output", q, h),
                ("ffn_gate", h, spec.inter),
                ("ffn_up", h, spec.inter),
                ("ffn_down", spec.inter, h),
            ]
        };
        for (i, (name, k, nrows)) in mats.into_iter().enumerate() {
            tensors.push((n(name), vec![k, nrows], formats[(8 * l + i) % formats.len()]));
        }
    }
    tensors.push(("output_norm.weight".into(), vec![h], WeightFormat::F32));
    if let Some(f) = &spec.rope_freqs {
        tensors.push(("rope_freqs.weight".into(), vec![f.len()], WeightFormat::F32));
    }

    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in &kv {
        put_str(&mut b, k);
        match v {
            Val::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Val::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Val::Bool(x) => {
                b.extend(7u32.to_le_bytes());
                b.push(*x as u8);
            }
            Val::Str(s) => {
                b.extend(8u32.to_le_bytes());
                put_str(&mut b, s);
            }
            Val::StrArr(a) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|s| put_str(&mut b, s));
            }
            Val::I32Arr(a) => {
                b.extend(9u32.to_le_bytes());
                b.extend(5u32.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
        }
    }
    let mut data = Vec::new();
    let mut infos = Vec::new();
    for (name, dims, f) in &tensors {
        let n: usize = dims.iter().product();
        let k = dims[0];
        let v: Vec<f32> = if name == "rope_freqs.weight" {
            spec.rope_freqs.clone().unwrap_or_default()
        } else if name.ends_with(".bias") {
            (0..n).map(|_| r.random_range(-0.5..0.5)).collect()
        } else if dims.len() == 1 {
            (0..n).map(|_| r.random_range(0.8..1.2)).collect()
        } else {
            let s = 1.5 / (k as f32).sqrt();
            (0..n).map(|_| r.random_range(-s..s)).collect()
        };
        while data.len() % 32 != 0 {
            data.push(0);
        }
        let q = quantize(*f, &v, k);
        if spec.f32_twin && dims.len() > 1 {
            let x = wllm::quant::dequantize(*f, &q, n / k, k).expect("dequantize");
            infos.push((name.clone(), dims.clone(), 0, data.len() as u64));
            x.iter().for_each(|v| data.extend(v.to_le_bytes()));
        } else {
            infos.push((name.clone(), dims.clone(), ggml_type(*f), data.len() as u64));
            data.extend(q);
        }
    }
    for (name, dims, t, off) in &infos {
        put_str(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend((*d as u64).to_le_bytes()));
        b.extend(t.to_le_bytes());
        b.extend(off.to_le_bytes());
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(data);
    let path = dir.join(name);
    std::fs::write(&path, b).expect("write tiny gguf");
    path
}
