//! GGUF v3 writer for `wllm quantize`: metadata entries (copied raw from a
//! source file or built from values), then the tensor directory with offsets
//! aligned to `general.alignment`, then the tensor data, streamed tensor by
//! tensor so that a model never has to fit in memory twice. The file is
//! written beside its destination and renamed into place when complete.

use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

use super::ModelError;

/// GGUF value type ids.
pub mod ty {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
}

/// A tensor as the directory lists it: name, GGUF dims (inner first), type and byte size.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub bytes: usize,
}

/// Metadata being assembled, in order.
#[derive(Default)]
pub struct Metadata {
    buf: Vec<u8>,
    keys: Vec<String>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

impl Metadata {
    /// An entry whose value bytes are already encoded (as read from a GGUF).
    pub fn raw(&mut self, key: &str, value_type: u32, value: &[u8]) {
        put_str(&mut self.buf, key);
        self.buf.extend(value_type.to_le_bytes());
        self.buf.extend(value);
        self.keys.push(key.to_string());
    }
    pub fn u32(&mut self, key: &str, v: u32) {
        self.raw(key, ty::U32, &v.to_le_bytes());
    }
    pub fn i32(&mut self, key: &str, v: i32) {
        self.raw(key, ty::I32, &v.to_le_bytes());
    }
    pub fn f32(&mut self, key: &str, v: f32) {
        self.raw(key, ty::F32, &v.to_le_bytes());
    }
    pub fn bool(&mut self, key: &str, v: bool) {
        self.raw(key, ty::BOOL, &[u8::from(v)]);
    }
    pub fn string(&mut self, key: &str, v: &str) {
        let mut b = Vec::new();
        put_str(&mut b, v);
        self.raw(key, ty::STRING, &b);
    }
    pub fn strings(&mut self, key: &str, v: &[String]) {
        let mut b = ty::STRING.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|s| put_str(&mut b, s));
        self.raw(key, ty::ARRAY, &b);
    }
    pub fn i32s(&mut self, key: &str, v: &[i32]) {
        let mut b = ty::I32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| b.extend(x.to_le_bytes()));
        self.raw(key, ty::ARRAY, &b);
    }
    pub fn f32s(&mut self, key: &str, v: &[f32]) {
        let mut b = ty::F32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| b.extend(x.to_le_bytes()));
        self.raw(key, ty::ARRAY, &b);
    }
    pub fn has(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }
}

/// A GGUF file being written: the header is out, tensors follow in directory order.
pub struct GgufWriter {
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    dest: PathBuf,
    tensors: Vec<TensorEntry>,
    next: usize,
    align: usize,
    written: u64,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |e| ModelError::Io(path.display().to_string(), e)
}

impl GgufWriter {
    /// Writes the header, metadata and directory of `tensors` to a temporary
    /// file beside `dest`.
    pub fn create(dest: &Path, meta: &Metadata, tensors: Vec<TensorEntry>, align: usize) -> Result<Self, ModelError> {
        let align = align.max(1);
        let tmp = dest.with_extension("gguf.partial");
        let file = File::create(&tmp).map_err(io(&tmp))?;
        let mut h = Vec::new();
        h.extend(b"GGUF");
        h.extend(3u32.to_le_bytes());
        h.extend((tensors.len() as u64).to_le_bytes());
        h.extend((meta.keys.len() as u64).to_le_bytes());
        h.extend(&meta.buf);
        let mut offset = 0usize;
        for t in &tensors {
            put_str(&mut h, &t.name);
            h.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| h.extend(d.to_le_bytes()));
            h.extend(t.ggml_type.to_le_bytes());
            h.extend((offset as u64).to_le_bytes());
            offset = (offset + t.bytes).div_ceil(align) * align;
        }
        h.resize(h.len().div_ceil(align) * align, 0);
        let mut out = BufWriter::new(file);
        out.write_all(&h).map_err(io(&tmp))?;
        Ok(Self {
            out: Some(out),
            tmp,
            dest: dest.to_path_buf(),
            tensors,
            next: 0,
            align,
            written: h.len() as u64,
        })
    }

    /// Appends the data of the next tensor of the directory.
    pub fn tensor(&mut self, data: &[u8]) -> Result<(), ModelError> {
        let t = self
            .tensors
            .get(self.next)
            .ok_or_else(|| ModelError::Corrupt("more tensors written than the directory lists".into()))?;
        if data.len() != t.bytes {
            return Err(ModelError::Corrupt(format!(
                "tensor {} has {} bytes, the directory says {}",
                t.name,
                data.len(),
                t.bytes
            )));
        }
        let pad = data.len().div_ceil(self.align) * self.align - data.len();
        let out = self.out.as_mut().expect("open until finish");
        out.write_all(data).map_err(io(&self.tmp))?;
        out.write_all(&vec![0u8; pad]).map_err(io(&self.tmp))?;
        self.written += (data.len() + pad) as u64;
        self.next += 1;
        Ok(())
    }

    /// Checks that every tensor was written, flushes and renames into place;
    /// returns the file size.
    pub fn finish(mut self) -> Result<u64, ModelError> {
        if self.next != self.tensors.len() {
            return Err(ModelError::Corrupt(format!(
                "{} of {} tensors written",
                self.next,
                self.tensors.len()
            )));
        }
        let mut out = self.out.take().expect("open until finish");
        out.flush().map_err(io(&self.tmp))?;
        let size = out.stream_position().map_err(io(&self.tmp))?;
        debug_assert_eq!(size, self.written);
        drop(out);
        std::fs::rename(&self.tmp, &self.dest).map_err(io(&self.dest))?;
        Ok(size)
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        // An unfinished file is removed (after `finish` it has been renamed away).
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
