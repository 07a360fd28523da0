//! `wllm quantize`: a GGUF model re-quantised at one of llama.cpp's mixes into
//! a new GGUF. Metadata (architecture, tokenizer, chat template, …) is copied
//! verbatim with `general.file_type` and `general.quantization_version` set as
//! llama-quantize sets them; each tensor gets the type `quant::mix::plan`
//! gives it — kept as stored when that is its type already, else
//! dequantised to f32 and quantised (rows split over the CPU's threads).

use std::path::Path;

use super::gguf::GgufFile;
use super::gguf_writer::{GgufWriter, Metadata, TensorEntry};
use super::{ModelConfig, ModelError};
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

fn type_name(t: u32) -> String {
    WeightFormat::from_ggml_type(t).map_or_else(|| super::source::ggml_type_name(t), |f| f.name())
}

/// Quantises every row of `x` (`n` rows of `k`) on all threads.
pub fn quantize_parallel(format: WeightFormat, x: &[f32], n: usize, k: usize) -> Result<Vec<u8>, quant::FormatError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    let rows = n.div_ceil(threads);
    let parts: Vec<Result<Vec<u8>, quant::FormatError>> = std::thread::scope(|s| {
        let handles: Vec<_> = x
            .chunks(rows.max(1) * k)
            .map(|c| s.spawn(move || quant::quantize::quantize(format, c, c.len() / k, k)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| unreachable!("quantize never panics")))
            .collect()
    });
    let mut out = Vec::with_capacity(format.stored_bytes(n, k));
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Writes `src` (a GGUF) re-quantised at `mix` to `dest`; `progress(done,
/// total, tensor)` is called before each tensor.
pub fn quantize_gguf(
    src: &Path,
    dest: &Path,
    mix: Mix,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<QuantizeReport, ModelError> {
    let file = GgufFile::open(src)?;
    let cfg = ModelConfig::from_gguf(&file)?;
    let model = ModelShape {
        n_layer: cfg.layers,
        n_gqa: cfg.heads / cfg.kv_heads.max(1),
    };
    let infos: Vec<_> = file.order.iter().map(|n| (n, &file.tensors[n])).collect();
    let shapes: Vec<TensorShape> = infos
        .iter()
        .map(|(n, t)| TensorShape {
            name: n.as_str(),
            dims: &t.dims,
        })
        .collect();
    let types = plan(mix, &model, &shapes);
    let mut entries = Vec::new();
    for ((name, t), ty) in infos.iter().zip(&types) {
        if WeightFormat::from_ggml_type(t.ggml_type).is_none() {
            return Err(ModelError::UnsupportedType {
                name: name.to_string(),
                ty: type_name(t.ggml_type),
            });
        }
        let ggml_type = ty.and_then(|f| f.ggml_type()).unwrap_or(t.ggml_type);
        let format = WeightFormat::from_ggml_type(ggml_type).expect("a known type");
        let elems: u64 = t.dims.iter().product();
        entries.push(TensorEntry {
            name: name.to_string(),
            dims: t.dims.clone(),
            ggml_type,
            bytes: format.stored_bytes(1, elems as usize),
        });
    }
    let mut meta = Metadata::default();
    let mut align = 32usize;
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
    for (key, v) in [
        ("general.file_type", mix.file_type()),
        ("general.quantization_version", 2),
    ] {
        if !meta.has(key) {
            meta.u32(key, v);
        }
    }
    let mut w = GgufWriter::create(dest, &meta, entries.clone(), align)?;
    let mut report = QuantizeReport {
        tensors: Vec::new(),
        bytes_in: std::fs::metadata(src).map(|m| m.len()).unwrap_or(0),
        bytes_out: 0,
    };
    for (i, ((name, t), e)) in infos.iter().zip(&entries).enumerate() {
        progress(i, infos.len(), name);
        let bytes = file.bytes(t);
        if e.ggml_type == t.ggml_type {
            w.tensor(bytes)?;
        } else {
            let from = WeightFormat::from_ggml_type(t.ggml_type).expect("checked");
            let to = WeightFormat::from_ggml_type(e.ggml_type).expect("checked");
            let k = t.dims[0] as usize;
            let n = (t.dims.iter().product::<u64>() as usize) / k.max(1);
            let x = quant::dequantize(from, bytes, n, k)?;
            w.tensor(&quantize_parallel(to, &x, n, k)?)?;
        }
        report
            .tensors
            .push((name.to_string(), type_name(t.ggml_type), type_name(e.ggml_type)));
    }
    progress(infos.len(), infos.len(), "");
    report.bytes_out = w.finish()?;
    Ok(report)
}
