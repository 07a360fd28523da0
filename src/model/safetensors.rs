//! A Hugging Face checkpoint directory: model.safetensors or shards listed in
//! model.safetensors.index.json, memory-mapped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::ModelError;
use crate::quant::WeightFormat;

/// One tensor's place: which shard, its dtype, shape and bytes.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub shard: usize,
    pub format: WeightFormat,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

/// The safetensors shards of a directory.
pub struct SafetensorsDir {
    maps: Vec<memmap2::Mmap>,
    pub tensors: HashMap<String, StTensor>,
}

fn io(p: &Path, e: std::io::Error) -> ModelError {
    ModelError::Io(p.display().to_string(), e)
}

/// `dir/name` where `name` is a relative path that stays inside `dir` (no
/// `..`, no root, no drive): an index naming `/etc/passwd` or
/// `../../other/model.safetensors` is refused, never opened.
pub fn shard_path(dir: &Path, name: &str) -> Option<PathBuf> {
    use std::path::Component;
    let p = Path::new(name);
    let plain = !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then(|| dir.join(p))
}

impl SafetensorsDir {
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index = dir.join("model.safetensors.index.json");
        let shards: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| io(&index, e))?;
            let j: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Corrupt(format!("{}: {e}", index.display())))?;
            let map = j["weight_map"]
                .as_object()
                .ok_or_else(|| ModelError::Corrupt(format!("{} has no weight_map", index.display())))?;
            let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
            files.sort();
            files.dedup();
            files
                .into_iter()
                .map(|f| {
                    shard_path(dir, &f).ok_or_else(|| {
                        ModelError::Corrupt(format!(
                            "{} names the shard {f:?}, which is not a file name inside the model's folder",
                            index.display()
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut maps = Vec::new();
        let mut tensors = HashMap::new();
        for (si, path) in shards.iter().enumerate() {
            let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
            // SAFETY: read-only private map; the file is not modified while loaded.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io(path, e))?;
            let (hlen, meta) = ::safetensors::SafeTensors::read_metadata(&map)
                .map_err(|e| ModelError::Corrupt(format!("{}: {e}", path.display())))?;
            let base = 8 + hlen;
            for (name, info) in meta.tensors() {
                let format = match info.dtype {
                    ::safetensors::Dtype::F32 => WeightFormat::F32,
                    ::safetensors::Dtype::F16 => WeightFormat::F16,
                    ::safetensors::Dtype::BF16 => WeightFormat::Bf16,
                    other => {
                        return Err(ModelError::UnsupportedType {
                            name,
                            ty: format!("{other:?}"),
                        });
                    }
                };
                let (s, e) = info.data_offsets;
                if base.checked_add(e).is_none_or(|end| end > map.len()) || s > e {
                    return Err(ModelError::Corrupt(format!(
                        "{}: tensor {name} runs past the file",
                        path.display()
                    )));
                }
                tensors.insert(
                    name,
                    StTensor {
                        shard: si,
                        format,
                        shape: info.shape.clone(),
                        start: base + s,
                        end: base + e,
                    },
                );
            }
            maps.push(map);
        }
        Ok(Self { maps, tensors })
    }

    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        &self.maps[t.shard][t.start..t.end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_stay_inside_the_model_folder() {
        let d = Path::new("/models/m");
        assert_eq!(
            shard_path(d, "model-00001-of-00002.safetensors"),
            Some(d.join("model-00001-of-00002.safetensors"))
        );
        assert_eq!(
            shard_path(d, "sub/part.safetensors"),
            Some(d.join("sub/part.safetensors"))
        );
        for bad in [
            "/etc/passwd",
            "../other/model.safetensors",
            "a/../../b",
            "",
            "..",
            "./../x",
        ] {
            assert_eq!(shard_path(d, bad), None, "{bad}");
        }
    }
}
