//! GGUF v2/v3 reader: header, metadata and tensor directory parsed with bounds
//! checks over a memory map; tensor bytes are borrowed from the map.

use std::collections::HashMap;
use std::path::Path;

use super::ModelError;
use crate::quant::WeightFormat;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    /// An array of strings or of arrays.
    Array(Vec<Value>),
    /// An array of numbers or booleans, kept as the file stores it (a
    /// `u8` array costs its bytes); read with `numbers`.
    Packed(Packed),
}

/// A GGUF array of one scalar type, its little-endian bytes as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    /// The GGUF value type of every element (0-7, 10-12).
    pub ty: u32,
    pub bytes: Vec<u8>,
}

impl Packed {
    pub fn len(&self) -> usize {
        self.bytes.len() / scalar_size(self.ty).unwrap_or(1)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Element `i` as a metadata value.
    pub fn get(&self, i: usize) -> Option<Value> {
        let n = scalar_size(self.ty)?;
        let b = self.bytes.get(i * n..i * n + n)?;
        let mut c = Cursor { b, pos: 0 };
        c.value(self.ty, 0).ok()
    }

    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// Bytes of a scalar GGUF value type (None: strings, arrays, unknown types).
fn scalar_size(ty: u32) -> Option<usize> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// The most memory a file's metadata may take once read (its strings and
/// their array slots; packed numbers at their size): a vocabulary of a
/// million tokens with its merges takes under a tenth of it.
pub const MAX_METADATA_BYTES: usize = 1 << 30;

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    /// An array's elements as numbers (booleans 0 or 1), packed or not.
    pub fn numbers(&self) -> Option<Vec<f64>> {
        match self {
            Value::Packed(p) => Some(
                p.iter()
                    .map(|v| v.as_f64().or(v.as_bool().map(f64::from)).unwrap_or(0.0))
                    .collect(),
            ),
            Value::Array(a) => Some(a.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect()),
            _ => None,
        }
    }
    /// The number of elements of an array (None: not an array).
    pub fn array_len(&self) -> Option<usize> {
        match self {
            Value::Packed(p) => Some(p.len()),
            Value::Array(a) => Some(a.len()),
            _ => None,
        }
    }
}

/// A tensor's place in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// GGUF order: `dims[0]` is the contiguous (inner) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// An open GGUF file.
pub struct GgufFile {
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    /// Every metadata entry in file order: key, GGUF value type and the byte
    /// range of its value (`wllm quantize` copies them verbatim).
    pub raw_kv: Vec<(String, u32, std::ops::Range<usize>)>,
    /// Tensor names in file order.
    pub order: Vec<String>,
    map: memmap2::Mmap,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

/// What reading the metadata has cost so far (see `MAX_METADATA_BYTES`).
struct Budget(usize);

impl Budget {
    fn spend(&mut self, n: usize) -> Result<(), ModelError> {
        self.0 = self.0.saturating_add(n);
        if self.0 > MAX_METADATA_BYTES {
            return Err(ModelError::Corrupt(format!(
                "the GGUF's metadata takes more than {MAX_METADATA_BYTES} bytes of memory to hold: the file is \
                 corrupt or hostile"
            )));
        }
        Ok(())
    }
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ModelError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| {
            ModelError::Corrupt(format!(
                "GGUF truncated: wanted {n} bytes at offset {} of {}",
                self.pos,
                self.b.len()
            ))
        })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn len(&mut self) -> Result<usize, ModelError> {
        let n = self.u64()?;
        if n > (self.b.len() - self.pos) as u64 {
            return Err(ModelError::Corrupt(format!(
                "GGUF length {n} at offset {} runs past the file",
                self.pos
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String, ModelError> {
        let n = self.len()?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    /// A value, its memory counted against `budget`.
    fn value_within(&mut self, ty: u32, depth: u32, budget: &mut Budget) -> Result<Value, ModelError> {
        match ty {
            8 => {
                let v = self.string()?;
                budget.spend(v.len())?;
                Ok(Value::Str(v))
            }
            9 if depth < 4 => {
                let at = self.u32()?;
                let n = self.len()?;
                if let Some(size) = scalar_size(at) {
                    let bytes = n
                        .checked_mul(size)
                        .ok_or_else(|| ModelError::Corrupt(format!("GGUF array of {n} values overflows")))?;
                    budget.spend(bytes)?;
                    return Ok(Value::Packed(Packed {
                        ty: at,
                        bytes: self.take(bytes)?.to_vec(),
                    }));
                }
                // Each element at least 8 bytes in the file (a length), 32 in memory.
                budget.spend(n.saturating_mul(std::mem::size_of::<Value>()))?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value_within(at, depth + 1, budget)?);
                }
                Ok(Value::Array(v))
            }
            _ => self.value(ty, depth),
        }
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, ModelError> {
        let v = match ty {
            0 => Value::U64(u64::from(self.take(1)?[0])),
            1 => Value::I64(i64::from(self.take(1)?[0] as i8)),
            2 => Value::U64(u64::from(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))),
            3 => Value::I64(i64::from(i16::from_le_bytes(self.take(2)?.try_into().expect("2")))),
            4 => Value::U64(u64::from(self.u32()?)),
            5 => Value::I64(i64::from(self.u32()? as i32)),
            6 => Value::F64(f64::from(f32::from_bits(self.u32()?))),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth < 4 => self.value_within(ty, depth, &mut Budget(0))?,
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            _ => return Err(ModelError::Corrupt(format!("GGUF metadata value of unknown type {ty}"))),
        };
        Ok(v)
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::Io(path.display().to_string(), e))?;
        // SAFETY: the map is read-only and private to this process; a file changed
        // underneath us is outside the contract (as with every mmap-based loader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::Io(path.display().to_string(), e))?;
        Self::parse(map)
    }

    /// Parses a GGUF held in memory (copied into an anonymous map).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        let io = |e| ModelError::Io("(memory)".into(), e);
        let mut m = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(io)?;
        m[..bytes.len()].copy_from_slice(bytes);
        let map = m.make_read_only().map_err(io)?;
        if bytes.is_empty() {
            return Err(ModelError::Corrupt("file too short to be GGUF".into()));
        }
        Self::parse(map)
    }

    fn parse(map: memmap2::Mmap) -> Result<Self, ModelError> {
        let mut c = Cursor { b: &map, pos: 0 };
        if c.take(4)
            .map_err(|_| ModelError::Corrupt("file too short to be GGUF".into()))?
            != b"GGUF"
        {
            return Err(ModelError::Corrupt("not a GGUF file (bad magic)".into()));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::Corrupt(format!(
                "GGUF version {version} is not supported (2 or 3)"
            )));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        let mut metadata = HashMap::new();
        let mut raw_kv = Vec::new();
        let mut budget = Budget(0);
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let at = c.pos;
            budget.spend(key.len() + 64)?;
            let v = c.value_within(ty, 0, &mut budget)?;
            raw_kv.push((key.clone(), ty, at..c.pos));
            metadata.insert(key, v);
        }
        let mut infos = Vec::new();
        let mut order = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let nd = c.u32()?;
            if nd == 0 || nd > 4 {
                return Err(ModelError::Corrupt(format!("tensor {name} has {nd} dimensions")));
            }
            let dims = (0..nd).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?;
            let ggml_type = c.u32()?;
            let offset = c.u64()?;
            order.push(name.clone());
            infos.push((name, dims, ggml_type, offset));
        }
        let align = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32)
            .max(1) as usize;
        let data_start = c.pos.div_ceil(align) * align;
        let mut tensors = HashMap::new();
        for (name, dims, ggml_type, offset) in infos {
            let elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let len = match (elems, WeightFormat::from_ggml_type(ggml_type)) {
                (Some(e), Some(f)) => {
                    let (be, bb) = f.block();
                    usize::try_from(e)
                        .ok()
                        .and_then(|e| e.div_ceil(be).checked_mul(bb))
                        .ok_or_else(|| ModelError::Corrupt(format!("tensor {name} dimensions overflow")))?
                }
                // Unknown types are kept so that using one names it; their length is unknown.
                (Some(_), None) => 0,
                (None, _) => return Err(ModelError::Corrupt(format!("tensor {name} dimensions overflow"))),
            };
            let start = data_start
                .checked_add(offset as usize)
                .filter(|s| s.checked_add(len).is_some_and(|e| e <= map.len()))
                .ok_or_else(|| {
                    ModelError::Corrupt(format!(
                        "tensor {name} ({len} bytes at offset {offset}) runs past the end of the file ({} bytes): \
                         the file is truncated",
                        map.len()
                    ))
                })?;
            tensors.insert(
                name,
                TensorInfo {
                    dims,
                    ggml_type,
                    start,
                    len,
                },
            );
        }
        Ok(Self {
            metadata,
            tensors,
            raw_kv,
            order,
            map,
        })
    }

    /// The raw bytes of a metadata value (see `raw_kv`).
    pub fn raw(&self, r: &std::ops::Range<usize>) -> &[u8] {
        &self.map[r.clone()]
    }

    /// The bytes of a tensor as stored.
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.start..t.start + t.len]
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
}
