//! `KvCache`: the paged KV pool on the device, one K and one V buffer per
//! layer slot of a page (`KvGroups`: a slot per layer when the model has one
//! group) of `num_blocks * block_size` token rows. Layer `l` of group `g` in
//! slot `s` reads and writes slot `s`'s buffers through group `g`'s block
//! tables. The model runner owns it; the block manager decides which rows each
//! sequence uses.

use super::KvGroups;
use crate::backend::{Backend, KvDtype};
use crate::model::{ModelConfig, ModelError, backend_err};

/// The paged KV cache: one K and one V buffer per layer slot.
pub struct KvCache<B: Backend> {
    // k, v: per slot (num_blocks * block_size, kv_heads * hd) of `dtype`
    pub k: Vec<B::Buffer>,
    pub v: Vec<B::Buffer>,
    pub groups: KvGroups,
    pub dtype: KvDtype,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Bytes of all K and V buffers.
    pub bytes: u64,
}

impl<B: Backend> KvCache<B> {
    pub fn new(
        ks: &B,
        cfg: &ModelConfig,
        groups: KvGroups,
        dtype: KvDtype,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        if groups.layer_slot.len() != cfg.layers
            || groups
                .layer_slot
                .iter()
                .any(|&(g, s)| g >= groups.len() || s >= groups.slots)
        {
            return Err(ModelError::Config(format!(
                "the KV groups place {} layers; the model has {}",
                groups.layer_slot.len(),
                cfg.layers
            )));
        }
        let per_slot = (num_blocks * block_size) as u64 * dtype.row_bytes((cfg.kv_heads * cfg.head_dim) as u64);
        if per_slot > ks.max_buffer() {
            return Err(ModelError::Config(format!(
                "a KV pool of {num_blocks} blocks needs {per_slot} bytes per layer, over the adapter's binding \
                 limit of {} bytes: lower --kv-cache-memory",
                ks.max_buffer()
            )));
        }
        let (rows, width) = ((num_blocks * block_size) as u64, (cfg.kv_heads * cfg.head_dim) as u32);
        let mk = |_| ks.kv_cache(rows, width, dtype).map_err(backend_err);
        let slots = groups.slots;
        Ok(Self {
            k: (0..slots).map(mk).collect::<Result<_, _>>()?,
            v: (0..slots).map(mk).collect::<Result<_, _>>()?,
            groups,
            dtype,
            num_blocks,
            block_size,
            bytes: 2 * slots as u64 * per_slot,
        })
    }
}
