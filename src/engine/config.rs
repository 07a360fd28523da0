//! How the KV pool works out for a model and the engine's settings (`EngineConfig`,
//! defined in `crate::config`).

pub use crate::config::EngineConfig;

/// The default KV pool size.
pub const DEFAULT_KV_CACHE_MEMORY: u64 = 512 << 20;

/// How the KV pool works out for a model: the seed's formula and the block count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KvPlan {
    /// 2 · L · H_kv · d_h · 4 bytes (f32).
    pub bytes_per_token: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub capacity_tokens: usize,
    pub max_model_len: usize,
    /// How many max-length sequences fit at once.
    pub max_concurrency: f64,
    pub pool_bytes: u64,
}

impl KvPlan {
    /// Sizes the pool: `memory` bytes (or the default), but never more than one
    /// layer's K buffer can bind (`max_binding`).
    pub fn new(
        bytes_per_token: usize,
        layers: usize,
        block_size: usize,
        memory: Option<u64>,
        max_binding: u64,
        model_context: usize,
        max_model_len: Option<usize>,
    ) -> Result<Self, String> {
        if block_size == 0 || !block_size.is_power_of_two() || block_size > 256 {
            return Err(format!(
                "--block-size must be a power of two from 1 to 256, got {block_size}"
            ));
        }
        let memory = memory.unwrap_or(DEFAULT_KV_CACHE_MEMORY);
        let block_bytes = (bytes_per_token * block_size) as u64;
        // One layer's K buffer holds bytes_per_token / (2 L) per token.
        let per_layer_block = block_bytes / (2 * layers as u64).max(1);
        let by_binding = max_binding / per_layer_block.max(1);
        let num_blocks = (memory / block_bytes.max(1)).min(by_binding) as usize;
        if num_blocks == 0 {
            return Err(format!(
                "--kv-cache-memory {memory} bytes holds no block of {block_size} tokens ({block_bytes} bytes each)"
            ));
        }
        let capacity_tokens = num_blocks * block_size;
        let max_model_len = match max_model_len {
            Some(m) if m > model_context => {
                return Err(format!(
                    "--max-model-len {m} exceeds the model's context length of {model_context} tokens"
                ));
            }
            Some(m) if m > capacity_tokens => {
                return Err(format!(
                    "--max-model-len {m} exceeds the KV pool's {capacity_tokens} tokens: raise --kv-cache-memory"
                ));
            }
            Some(0) => return Err("--max-model-len must be at least 1".into()),
            Some(m) => m,
            None => model_context.min(capacity_tokens),
        };
        Ok(Self {
            bytes_per_token,
            block_size,
            num_blocks,
            capacity_tokens,
            max_model_len,
            max_concurrency: capacity_tokens as f64 / max_model_len as f64,
            pool_bytes: num_blocks as u64 * block_bytes,
        })
    }

    /// The start-up line, in the spirit of vLLM's "KV cache size / maximum concurrency".
    pub fn describe(&self) -> String {
        format!(
            "KV cache: {} bytes/token (2·L·H_kv·d_h·4), block size {}, {} blocks = {} tokens ({:.1} MiB); \
             max model len {}, maximum concurrency {:.2}x",
            self.bytes_per_token,
            self.block_size,
            self.num_blocks,
            self.capacity_tokens,
            self.pool_bytes as f64 / (1 << 20) as f64,
            self.max_model_len,
            self.max_concurrency
        )
    }
}
