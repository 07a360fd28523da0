//! BlockManager: the host-side pool of KV blocks (the bookshelf). Each sequence
//! owns a `BlockTable` (logical → physical). Blocks carry a ref count; with
//! automatic prefix caching every *full* block gets a hash chained on its
//! parent's hash and its token ids, a new sequence reuses the longest run of
//! cached blocks it matches exactly (confirmed by comparing tokens), and freed
//! blocks keep their hash, evicted least-recently-freed first — a sequence's
//! blocks are released tail first, so its tail goes before its shared prefix —
//! and only when no never-cached free block is left.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

#[derive(Clone, Debug, Default)]
struct Block {
    ref_count: u32,
    /// Set while the block is registered in the prefix cache.
    hash: Option<u64>,
    /// The tokens whose KV the block holds (full blocks only), to confirm hits.
    token_ids: Vec<u32>,
    /// Key in `cached_free` while the block is free but still cached.
    free_tick: Option<u64>,
}

/// A sequence's blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Physical block of each logical block.
    pub blocks: Vec<u32>,
    /// Chained hash of each leading full block registered in the cache.
    pub hashes: Vec<u64>,
}

/// The pool.
#[derive(Debug)]
pub struct BlockManager {
    pub block_size: usize,
    blocks: Vec<Block>,
    /// Free blocks holding nothing cached; used first, lowest id first, so
    /// that the pool's used part stays a short prefix (the backend binds and
    /// touches only that prefix: a large pool costs nothing until it fills).
    clean: BTreeSet<u32>,
    /// Free blocks still in the prefix cache, oldest release first.
    cached_free: BTreeMap<u64, u32>,
    tick: u64,
    cache: HashMap<u64, u32>,
    pub enable_prefix_caching: bool,
}

/// Hash of a full block: its parent's hash and its tokens.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            clean: (0..num_blocks as u32).collect(),
            cached_free: BTreeMap::new(),
            tick: 0,
            cache: HashMap::new(),
            enable_prefix_caching,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (clean or evictable).
    pub fn num_free_blocks(&self) -> usize {
        self.clean.len() + self.cached_free.len()
    }

    /// Fraction of blocks in use by live sequences.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free_blocks() as f64 / self.blocks.len().max(1) as f64
    }

    /// Free blocks still registered in the prefix cache.
    pub fn num_cached_free_blocks(&self) -> usize {
        self.cached_free.len()
    }

    /// Whether a block is registered in the prefix cache (held or free).
    pub fn is_cached(&self, block: u32) -> bool {
        self.blocks[block as usize].hash.is_some()
    }

    pub fn ref_count(&self, block: u32) -> u32 {
        self.blocks[block as usize].ref_count
    }

    /// The longest run of cached full blocks that `tokens` starts with, leaving at
    /// least one token to compute. Returns the blocks and their hashes.
    pub fn cached_prefix(&self, tokens: &[u32]) -> (Vec<u32>, Vec<u64>) {
        let (mut blocks, mut hashes) = (Vec::new(), Vec::new());
        if !self.enable_prefix_caching || tokens.is_empty() {
            return (blocks, hashes);
        }
        let max_full = (tokens.len() - 1) / self.block_size;
        let mut parent = None;
        for i in 0..max_full {
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let h = block_hash(parent, chunk);
            match self.cache.get(&h) {
                Some(&b) if self.blocks[b as usize].token_ids == chunk => {
                    blocks.push(b);
                    hashes.push(h);
                    parent = Some(h);
                }
                _ => break,
            }
        }
        (blocks, hashes)
    }

    /// Whether a new sequence can take `cached` prefix blocks and enough new blocks
    /// to hold `total_tokens`.
    pub fn can_allocate(&self, cached: &[u32], total_tokens: usize) -> bool {
        let revive = cached
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count();
        let new = total_tokens.div_ceil(self.block_size).saturating_sub(cached.len());
        revive + new <= self.num_free_blocks()
    }

    /// Gives a new sequence its cached prefix and blocks for `total_tokens`.
    /// The caller checked `can_allocate`.
    pub fn allocate(&mut self, table: &mut BlockTable, cached: (Vec<u32>, Vec<u64>), total_tokens: usize) {
        debug_assert!(table.blocks.is_empty());
        for &b in &cached.0 {
            self.take_ref(b);
        }
        table.blocks = cached.0;
        table.hashes = cached.1;
        self.may_append(table, total_tokens);
    }

    /// Whether `table` can grow to hold `total_tokens`.
    pub fn can_append(&self, table: &BlockTable, total_tokens: usize) -> bool {
        total_tokens
            .div_ceil(self.block_size)
            .saturating_sub(table.blocks.len())
            <= self.num_free_blocks()
    }

    /// Grows `table` to hold `total_tokens` (the caller checked `can_append`).
    pub fn may_append(&mut self, table: &mut BlockTable, total_tokens: usize) {
        while table.blocks.len() * self.block_size < total_tokens {
            let b = self.pop_free().expect("may_append without can_append");
            table.blocks.push(b);
        }
    }

    fn take_ref(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.ref_count == 0
            && let Some(t) = blk.free_tick.take()
        {
            self.cached_free.remove(&t);
        }
        blk.ref_count += 1;
    }

    fn pop_free(&mut self) -> Option<u32> {
        let b = match self.clean.pop_first() {
            Some(b) => b,
            None => {
                let (_, b) = self.cached_free.pop_first()?;
                let blk = &mut self.blocks[b as usize];
                blk.free_tick = None;
                if let Some(h) = blk.hash.take()
                    && self.cache.get(&h) == Some(&b)
                {
                    self.cache.remove(&h);
                }
                blk.token_ids.clear();
                b
            }
        };
        self.blocks[b as usize].ref_count = 1;
        Some(b)
    }

    /// Registers the full blocks among the first `num_computed` tokens of the sequence.
    pub fn cache_full_blocks(&mut self, table: &mut BlockTable, tokens: &[u32], num_computed: usize) {
        if !self.enable_prefix_caching {
            return;
        }
        let full = (num_computed / self.block_size).min(table.blocks.len());
        while table.hashes.len() < full {
            let i = table.hashes.len();
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let h = block_hash(table.hashes.last().copied(), chunk);
            let b = table.blocks[i];
            let blk = &mut self.blocks[b as usize];
            if blk.hash.is_none() && !self.cache.contains_key(&h) {
                blk.hash = Some(h);
                blk.token_ids = chunk.to_vec();
                self.cache.insert(h, b);
            }
            table.hashes.push(h);
        }
    }

    /// Releases a sequence's blocks, tail first.
    pub fn deallocate(&mut self, table: &mut BlockTable) {
        for &b in table.blocks.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            assert!(blk.ref_count > 0, "block {b} freed twice");
            blk.ref_count -= 1;
            if blk.ref_count == 0 {
                if blk.hash.is_some() {
                    self.tick += 1;
                    blk.free_tick = Some(self.tick);
                    self.cached_free.insert(self.tick, b);
                } else {
                    self.clean.insert(b);
                }
            }
        }
        table.blocks.clear();
        table.hashes.clear();
    }

    /// Drops every cached-but-free block from the prefix cache.
    pub fn reset_prefix_cache(&mut self) {
        while let Some((_, b)) = self.cached_free.pop_first() {
            let blk = &mut self.blocks[b as usize];
            blk.free_tick = None;
            if let Some(h) = blk.hash.take() {
                self.cache.remove(&h);
            }
            blk.token_ids.clear();
            self.clean.insert(b);
        }
    }

    /// Checks the pool's invariants against the live tables (tests call this).
    pub fn check_consistency<'a>(&self, live: impl IntoIterator<Item = &'a BlockTable>) -> Result<(), String> {
        let mut refs = vec![0u32; self.blocks.len()];
        for t in live {
            for &b in &t.blocks {
                refs[b as usize] += 1;
            }
        }
        let mut free_seen = vec![false; self.blocks.len()];
        for &b in self.clean.iter().chain(self.cached_free.values()) {
            if std::mem::replace(&mut free_seen[b as usize], true) {
                return Err(format!("block {b} is on a free list twice"));
            }
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            if blk.ref_count != refs[i] {
                return Err(format!(
                    "block {i}: ref count {} but {} tables hold it",
                    blk.ref_count, refs[i]
                ));
            }
            if (blk.ref_count == 0) != free_seen[i] {
                return Err(format!(
                    "block {i}: ref count {} but free-listed = {}",
                    blk.ref_count, free_seen[i]
                ));
            }
        }
        Ok(())
    }
}
