//! `PipelineStore`: the compiled pipelines of one device, shared by every
//! engine and `Kernels` opened on it in this process, and persisted across
//! processes through wgpu's pipeline cache where the adapter offers
//! `PIPELINE_CACHE` (driver machine code kept under the user's cache directory).
//!
//! A pipeline is compiled the first time something asks for it (lazily: a gemm
//! row tile is built by the first step that needs it), once per process: two
//! threads asking for the same one wait for one compile.
//!
//! The cache file is named by wgpu's adapter key and a hash of the adapter,
//! driver, wllm version and every shader template, and carries its own header
//! (magic, that hash, length, checksum): a file that is corrupt, truncated or
//! written for another adapter or another wllm is ignored and rebuilt.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{Binding, GpuError, Kernel};

const MAGIC: &[u8; 8] = b"WLLMPC01";
const HEADER: usize = 8 + 8 + 8 + 8;

/// FNV-1a, 64 bits: a stable hash for cache keys and the file checksum.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        // Separate parts so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The user's cache directory for wllm: `$XDG_CACHE_HOME/wllm`, else the platform's.
pub fn user_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = if cfg!(target_os = "windows") {
        env("LOCALAPPDATA")
    } else if cfg!(target_os = "macos") {
        env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join("Library/Caches")))
    } else {
        env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join(".cache")))
    };
    base.map(|b| b.join("wllm"))
}

/// How many pipelines were compiled in this process and the seconds it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PipelineStats {
    pub compiled: u64,
    pub compile_seconds: f64,
    /// Whether a persisted pipeline cache is in use, and whether it had data at start.
    pub disk_cache: bool,
    pub disk_cache_loaded: bool,
}

struct DiskCache {
    cache: wgpu::PipelineCache,
    path: PathBuf,
    key: u64,
    loaded: bool,
    dirty: AtomicBool,
}

type Slot = Arc<Mutex<Option<Arc<Kernel>>>>;

/// The compiled pipelines of one device (see the module doc).
pub struct PipelineStore {
    slots: Mutex<HashMap<u64, Slot>>,
    disk: Option<DiskCache>,
    compiled: AtomicU64,
    compile_nanos: AtomicU64,
}

impl PipelineStore {
    /// A store with no persisted cache.
    pub fn in_memory() -> Self {
        Self {
            slots: Mutex::default(),
            disk: None,
            compiled: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
        }
    }

    /// A store persisted under `dir` when the device offers `PIPELINE_CACHE` and
    /// wgpu has a cache key for the adapter; otherwise in memory only.
    pub fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, dir: Option<&Path>, shader_sources: &[&str]) -> Self {
        let mut me = Self::in_memory();
        let (Some(dir), Some(adapter_key)) = (dir, wgpu::util::pipeline_cache_key(info)) else {
            return me;
        };
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return me;
        }
        let mut parts: Vec<&[u8]> = vec![
            info.name.as_bytes(),
            info.driver.as_bytes(),
            info.driver_info.as_bytes(),
            env!("CARGO_PKG_VERSION").as_bytes(),
        ];
        parts.extend(shader_sources.iter().map(|s| s.as_bytes()));
        let key = fnv1a(&parts);
        let path = dir.join(format!("{adapter_key}-{key:016x}.bin"));
        let data = std::fs::read(&path)
            .ok()
            .and_then(|b| unwrap_file(&b, key).map(<[u8]>::to_vec));
        // SAFETY: `data` is only ever bytes that `PipelineCache::get_data` returned
        // on an adapter with the same wgpu cache key, driver and wllm version: the
        // file's header carries the hash of those and a checksum of the payload,
        // and anything else is dropped above. wgpu validates its own header too,
        // and `fallback: true` makes an empty cache if the driver refuses the data.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("wllm pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        me.disk = Some(DiskCache {
            cache,
            path,
            key,
            loaded: data.is_some(),
            dirty: AtomicBool::new(false),
        });
        me
    }

    /// The pipeline for `source`, compiled on first use (once per process).
    pub fn kernel(
        &self,
        device: &wgpu::Device,
        name: &str,
        source: &str,
        storage: &[Binding],
    ) -> Result<Arc<Kernel>, GpuError> {
        let kinds: Vec<u8> = storage.iter().map(|b| *b as u8).collect();
        let id = fnv1a(&[name.as_bytes(), source.as_bytes(), &kinds]);
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(id).or_default().clone()
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let t0 = Instant::now();
        let k = Arc::new(Kernel::new(
            device,
            name,
            source,
            storage,
            self.disk.as_ref().map(|d| &d.cache),
        )?);
        self.compiled.fetch_add(1, Ordering::Relaxed);
        self.compile_nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(d) = &self.disk {
            d.dirty.store(true, Ordering::Release);
        }
        *slot = Some(k.clone());
        Ok(k)
    }

    pub fn stats(&self) -> PipelineStats {
        PipelineStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            compile_seconds: self.compile_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            disk_cache: self.disk.is_some(),
            disk_cache_loaded: self.disk.as_ref().is_some_and(|d| d.loaded),
        }
    }

    /// The persisted cache file, when there is one.
    pub fn cache_path(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.path.as_path())
    }

    /// Writes the pipeline cache to disk if pipelines were compiled since the
    /// last save. Failing to write is not an error of the step: the cache is an
    /// optimisation, so it is reported once on stderr and dropped.
    pub fn save_if_dirty(&self) {
        let Some(d) = &self.disk else { return };
        if !d.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let Some(data) = d.cache.get_data() else { return };
        if let Err(e) = write_atomically(&d.path, &wrap_file(&data, d.key)) {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!("wllm: not saving the pipeline cache to {}: {e}", d.path.display());
            }
        }
    }
}

fn wrap_file(data: &[u8], key: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(&[data]).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The payload of a cache file written by `wrap_file` for `key`, or `None`.
fn unwrap_file(bytes: &[u8], key: u64) -> Option<&[u8]> {
    let word = |i: usize| {
        bytes
            .get(i..i + 8)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..8)? != MAGIC || word(8)? != key {
        return None;
    }
    let len = usize::try_from(word(16)?).ok()?;
    let data = bytes.get(HEADER..)?;
    (data.len() == len && fnv1a(&[data]) == word(24)?).then_some(data)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_file_round_trips_and_rejects_damage() {
        let data = b"pipeline bytes".to_vec();
        let f = wrap_file(&data, 42);
        assert_eq!(unwrap_file(&f, 42), Some(&data[..]));
        assert_eq!(unwrap_file(&f, 43), None, "another key");
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(unwrap_file(&bad, 42), None, "flipped payload byte");
        assert_eq!(unwrap_file(&f[..f.len() - 1], 42), None, "truncated");
        assert_eq!(unwrap_file(b"garbage", 42), None);
        assert_eq!(unwrap_file(&[], 42), None);
    }
}
