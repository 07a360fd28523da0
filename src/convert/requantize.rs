//! `wllm quantize`: a model re-quantised at one of llama.cpp's mixes into a
//! new GGUF. From a GGUF, metadata (architecture, tokenizer, chat template, …)
//! is copied verbatim with `general.file_type` and
//! `general.quantization_version` set as llama-quantize sets them; from a
//! Hugging Face directory it is built by `hf_to_gguf`. Each tensor gets the
//! type `quant::mix::plan` gives it — kept as stored when that is its type
//! already, else dequantised to f32 and quantised (rows split over the CPU's
//! threads).

use std::path::Path;

use super::hf_to_gguf;
use crate::model::gguf_writer::{GgufWriter, Metadata, TensorEntry};
use crate::model::{ModelError, ModelFiles};
use crate::quant::mix::{Mix, ModelShape, TensorShape, plan};
use crate::quant::{self, WeightFormat};

/// What was written.
#[derive(Debug)]
pub struct QuantizeReport {
    /// Each tensor: name, stored type name, written type name.
    pub tensors: Vec<(String, String, String)>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// One tensor to write: its GGUF name and dims, where its values come from,
/// and the type it gets.
struct Item {
    name: String,
    dims: Vec<u64>,
    from: WeightFormat,
    to: WeightFormat,
    /// Values not in the source files (rope_freqs from an HF config).
    owned: Option<Vec<f32>>,
}

fn dir_size(p: &Path) -> u64 {
    if p.is_dir() {
        std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| e.metadata().map_or(0, |m| m.len())).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(p).map_or(0, |m| m.len())
    }
}

/// Writes `src` (a GGUF file or a Hugging Face directory) re-quantised at
/// `mix` to `dest`; `progress(done, total, tensor)` is called before each
/// tensor and once at the end.
pub fn quantize_model(
    src: &Path,
    dest: &Path,
    mix: Mix,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<QuantizeReport, ModelError> {
    let files = ModelFiles::open(src)?;
    let cfg = files.config()?;
    let mut meta = Metadata::default();
    let mut align = 32usize;
    let hf = matches!(files, ModelFiles::Hf { .. });
    let mut items = Vec::new();
    match &files {
        ModelFiles::Gguf { file, .. } => {
            for (key, vt, range) in &file.raw_kv {
                match key.as_str() {
                    "general.file_type" => meta.u32(key, mix.file_type()),
                    "general.quantization_version" => meta.u32(key, 2),
                    k => {
                        if k == "general.alignment" {
                            align = file.metadata[k].as_u64().unwrap_or(32) as usize;
                        }
                        meta.raw(k, *vt, file.raw(range));
                    }
                }
            }
            for name in &file.order {
                let t = files.stored_tensor(name)?;
                let dims = file.tensors[name].dims.clone();
                items.push(Item {
                    name: name.clone(),
                    dims,
                    from: t.format,
                    to: t.format,
                    owned: None,
                });
            }
        }
        ModelFiles::Hf { dir, .. } => {
            hf_to_gguf::metadata(dir, &cfg, &mut meta)?;
            for name in hf_to_gguf::tensor_names(&cfg, files.has("output.weight")) {
                let t = files.stored_tensor(&name)?;
                let one_d = name.ends_with("norm.weight");
                let dims = if one_d {
                    vec![(t.rows * t.cols) as u64]
                } else {
                    vec![t.cols as u64, t.rows as u64]
                };
                // llama.cpp keeps 1-D tensors in F32.
                let to = if one_d { WeightFormat::F32 } else { t.format };
                items.push(Item {
                    name,
                    dims,
                    from: t.format,
                    to,
                    owned: None,
                });
            }
            if let Some(f) = &cfg.rope_freq_factors {
                items.push(Item {
                    name: "rope_freqs.weight".into(),
                    dims: vec![f.len() as u64],
                    from: WeightFormat::F32,
                    to: WeightFormat::F32,
                    owned: Some(f.iter().map(|&v| v as f32).collect()),
                });
            }
        }
    }
    for (key, v) in [
        ("general.file_type", mix.file_type()),
        ("general.quantization_version", 2),
    ] {
        if !meta.has(key) {
            meta.u32(key, v);
        }
    }
    let model = ModelShape {
        n_layer: cfg.layers,
        n_gqa: cfg.heads / cfg.kv_heads.max(1),
    };
    let shapes: Vec<TensorShape> = items
        .iter()
        .map(|i| TensorShape {
            name: &i.name,
            dims: &i.dims,
        })
        .collect();
    let types = plan(mix, &model, &shapes);
    for (item, ty) in items.iter_mut().zip(types) {
        if let Some(t) = ty {
            item.to = t;
        }
    }
    let entries: Vec<TensorEntry> = items
        .iter()
        .map(|i| {
            let elems: u64 = i.dims.iter().product();
            TensorEntry {
                name: i.name.clone(),
                dims: i.dims.clone(),
                ggml_type: i.to.ggml_type().expect("a stored type"),
                bytes: i.to.stored_bytes(1, elems as usize),
            }
        })
        .collect();
    let mut w = GgufWriter::create(dest, &meta, entries, align)?;
    let mut report = QuantizeReport {
        tensors: Vec::new(),
        bytes_in: dir_size(src),
        bytes_out: 0,
    };
    let tensor_err = |name: &str| {
        let name = name.to_string();
        move |source| ModelError::Tensor { name, source }
    };
    for (i, item) in items.iter().enumerate() {
        progress(i, items.len(), &item.name);
        let k = item.dims[0] as usize;
        let n = (item.dims.iter().product::<u64>() as usize) / k.max(1);
        let permute = hf && (item.name.ends_with("attn_q.weight") || item.name.ends_with("attn_k.weight"));
        if let Some(v) = &item.owned {
            w.tensor(&quant::quantize::quantize(item.to, v, n, k).map_err(tensor_err(&item.name))?)?;
        } else if item.from == item.to && !permute {
            w.tensor(&files.stored_tensor(&item.name)?.bytes)?;
        } else {
            let t = files.stored_tensor(&item.name)?;
            let mut x = quant::dequantize(t.format, &t.bytes, n, k).map_err(tensor_err(&item.name))?;
            if permute {
                let heads = if item.name.ends_with("attn_q.weight") {
                    cfg.heads
                } else {
                    cfg.kv_heads
                };
                x = hf_to_gguf::permute_rows(&x, heads, cfg.head_dim, k);
            }
            w.tensor(&quant::quantize::quantize_parallel(item.to, &x, n, k).map_err(tensor_err(&item.name))?)?;
        }
        report
            .tensors
            .push((item.name.clone(), item.from.name(), item.to.name()));
    }
    progress(items.len(), items.len(), "");
    report.bytes_out = w.finish()?;
    Ok(report)
}
