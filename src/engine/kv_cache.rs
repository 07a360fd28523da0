//! `KvCache`: the paged KV pool on the device, one K and one V buffer per
//! layer of `num_blocks * block_size` token rows. The model runner owns it;
//! the block manager decides which rows each sequence uses.

use crate::backend::Backend;
use crate::model::{ModelConfig, ModelError, backend_err};

/// The paged KV cache: one K and one V buffer per layer.
pub struct KvCache<B: Backend> {
    // k, v: per layer (num_blocks * block_size, kv_heads * hd) f32
    pub k: Vec<B::Buffer>,
    pub v: Vec<B::Buffer>,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Bytes of all K and V buffers.
    pub bytes: u64,
}

impl<B: Backend> KvCache<B> {
    pub fn new(ks: &B, cfg: &ModelConfig, num_blocks: usize, block_size: usize) -> Result<Self, ModelError> {
        let per_layer = (num_blocks * block_size * cfg.kv_heads * cfg.head_dim * 4) as u64;
        if per_layer > ks.max_buffer() {
            return Err(ModelError::Config(format!(
                "a KV pool of {num_blocks} blocks needs {per_layer} bytes per layer, over the adapter's binding \
                 limit of {} bytes: lower --kv-cache-memory",
                ks.max_buffer()
            )));
        }
        let (rows, width) = ((num_blocks * block_size) as u64, (cfg.kv_heads * cfg.head_dim) as u32);
        let mk = |_| ks.kv_cache(rows, width).map_err(backend_err);
        Ok(Self {
            k: (0..cfg.layers).map(mk).collect::<Result<_, _>>()?,
            v: (0..cfg.layers).map(mk).collect::<Result<_, _>>()?,
            num_blocks,
            block_size,
            bytes: 2 * cfg.layers as u64 * per_layer,
        })
    }
}
