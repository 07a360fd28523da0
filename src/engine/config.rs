//! How the KV pool works out for a model and the engine's settings (`EngineConfig`,
//! defined in `crate::config`).

pub use crate::config::EngineConfig;

use super::KvGroups;
use crate::config::KvDtype;

/// The default KV pool size.
pub const DEFAULT_KV_CACHE_MEMORY: u64 = 512 << 20;

/// How the KV pool works out for a model: the seed's formula and the block count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KvPlan {
    /// The cache's element type.
    pub dtype: KvDtype,
    /// 2 · L · H_kv · d_h · b bytes (b = 4 for f32, 2 for f16).
    pub bytes_per_token: usize,
    pub block_size: usize,
    /// Pool pages: a block of every layer slot of a KV group.
    pub num_blocks: usize,
    /// KV groups sharing the pool (1: the flat layout) and layer slots a page holds.
    pub kv_groups: usize,
    pub layers_per_block: usize,
    /// Tokens of context the pool holds when full of max-length sequences.
    pub capacity_tokens: usize,
    /// What the same memory holds in the flat layout (every layer a block per token block).
    pub flat_capacity_tokens: usize,
    pub max_model_len: usize,
    /// How many max-length sequences fit at once.
    pub max_concurrency: f64,
    pub pool_bytes: u64,
}

impl KvPlan {
    /// Sizes the pool: `memory` bytes (or the default), but never more than one
    /// slot's K buffer can bind (`max_binding`), for steps of up to `chunk` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        groups: &KvGroups,
        dtype: KvDtype,
        bytes_per_token: usize,
        block_size: usize,
        chunk: usize,
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
        let layers = groups.layer_slot.len().max(1) as u64;
        // One layer's K buffer holds bytes_per_token / (2 L) per token.
        let per_layer_block = (bytes_per_token * block_size) as u64 / (2 * layers);
        let block_bytes = 2 * groups.slots as u64 * per_layer_block;
        let by_binding = max_binding / per_layer_block.max(1);
        let num_blocks = (memory / block_bytes.max(1)).min(by_binding) as usize;
        if num_blocks == 0 {
            return Err(format!(
                "--kv-cache-memory {memory} bytes holds no block of {block_size} tokens ({block_bytes} bytes each)"
            ));
        }
        let flat_capacity_tokens =
            (memory / (2 * layers * per_layer_block).max(1)).min(by_binding) as usize * block_size;
        let longest = groups.longest_fit(num_blocks, block_size, chunk);
        let max_model_len = match max_model_len {
            Some(m) if m > model_context => {
                return Err(format!(
                    "--max-model-len {m} exceeds the model's context length of {model_context} tokens"
                ));
            }
            Some(m) if m > longest => {
                return Err(format!(
                    "--max-model-len {m} exceeds the {longest} tokens the KV pool holds for one sequence: raise \
                     --kv-cache-memory"
                ));
            }
            Some(0) => return Err("--max-model-len must be at least 1".into()),
            Some(m) => m,
            None => model_context.min(longest),
        };
        // Tokens of pool a max-length sequence costs: its length in each full
        // group, a window and a chunk in each windowed one.
        let cost: usize = groups
            .windows
            .iter()
            .map(|w| match w {
                None => max_model_len,
                Some(w) => {
                    max_model_len.min(((w.saturating_sub(1) + chunk.max(1)).div_ceil(block_size) + 1) * block_size)
                }
            })
            .sum();
        let max_concurrency = (num_blocks * block_size) as f64 / cost.max(1) as f64;
        Ok(Self {
            dtype,
            bytes_per_token,
            block_size,
            num_blocks,
            kv_groups: groups.len(),
            layers_per_block: groups.slots,
            capacity_tokens: ((num_blocks * block_size) as u128 * max_model_len as u128 / cost.max(1) as u128) as usize,
            flat_capacity_tokens,
            max_model_len,
            max_concurrency,
            pool_bytes: num_blocks as u64 * block_bytes,
        })
    }

    /// The start-up line, in the spirit of vLLM's "KV cache size / maximum concurrency".
    pub fn describe(&self) -> String {
        let hybrid = if self.kv_groups > 1 || self.capacity_tokens != self.flat_capacity_tokens {
            format!(
                " (hybrid: {} KV groups of {} layers, windowed blocks released; flat layout: {} tokens)",
                self.kv_groups, self.layers_per_block, self.flat_capacity_tokens
            )
        } else {
            String::new()
        };
        format!(
            "KV cache: {} {} bytes/token (2·L·H_kv·d_h·{}), block size {}, {} blocks = {} tokens{hybrid} ({:.1} \
             MiB); maximum concurrency for {} tokens per request: {:.2}x",
            self.dtype,
            self.bytes_per_token,
            self.dtype.bytes_per_value(),
            self.block_size,
            self.num_blocks,
            self.capacity_tokens,
            self.pool_bytes as f64 / (1 << 20) as f64,
            self.max_model_len,
            self.max_concurrency
        )
    }
}
