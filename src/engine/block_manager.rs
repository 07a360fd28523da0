//! BlockManager: the host-side pool of KV blocks (the bookshelf). Each sequence
//! owns a `BlockTable` (logical → physical) with one row per KV group
//! (`KvGroups`: one for most models; Gemma's global and windowed layers apart).
//! Blocks carry a ref count; with automatic prefix caching every *full* block
//! gets a hash chained on its parent's hash and its token ids, a new sequence
//! reuses the longest run of cached blocks it matches exactly (confirmed by
//! comparing tokens; a windowed group needs only the blocks its window reads),
//! and freed blocks keep their hash, evicted least-recently-freed first — a
//! sequence's blocks are released tail first, so its tail goes before its
//! shared prefix — and only when no never-cached free block is left. A
//! windowed group's blocks that fall out of the window are released as the
//! sequence advances (`release_out_of_window`): their entries become `FREED`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

/// A windowed group's table entry whose block fell out of every window and went
/// back to the pool. The device never reads its keys (the window masks them)
/// and is handed block 0 in its place.
pub const FREED: u32 = u32::MAX;

#[derive(Clone, Debug, Default)]
struct Block {
    ref_count: u32,
    /// Set while the block is registered in the prefix cache (its cache key).
    hash: Option<u64>,
    /// The tokens whose KV the block holds (full blocks only), to confirm hits.
    token_ids: Vec<u32>,
    /// The KV group whose layers the block holds while registered.
    group: usize,
    /// Key in `cached_free` while the block is free but still cached.
    free_tick: Option<u64>,
}

/// A sequence's blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Each KV group's physical block of each logical block (`FREED` where a
    /// windowed group released it); every group has the same length.
    pub blocks: Vec<Vec<u32>>,
    /// Chained hash of each leading full block registered in the cache.
    pub hashes: Vec<u64>,
}

impl BlockTable {
    /// Logical blocks (tokens the table covers / block size).
    pub fn len(&self) -> usize {
        self.blocks.first().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The physical blocks the table holds (every group, `FREED` left out).
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.blocks.iter().flatten().copied().filter(|&b| b != FREED)
    }
}

/// The cached blocks a new sequence starts with (`BlockManager::cached_prefix`).
#[derive(Clone, Debug, Default)]
pub struct CachedPrefix {
    /// Each group's blocks (`FREED` before a windowed group's window).
    pub blocks: Vec<Vec<u32>>,
    pub hashes: Vec<u64>,
}

impl CachedPrefix {
    /// Logical blocks of the prefix.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
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
    /// Each KV group's sliding window in tokens (`None`: the whole context).
    windows: Vec<Option<usize>>,
}

/// Hash of a full block: its parent's hash and its tokens.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The prefix cache's key of a block of group `g` with chained hash `h`
/// (group 0's is `h`; a hit is also confirmed by the block's group).
fn cache_key(h: u64, g: usize) -> u64 {
    if g == 0 {
        return h;
    }
    let mut s = std::hash::DefaultHasher::new();
    (h, g, "kv-group").hash(&mut s);
    s.finish()
}

/// The first logical block a windowed group still needs once `computed` tokens
/// are in the cache: the next token (position `computed`) reads keys from
/// `computed + 1 - window` on.
pub fn first_needed_block(computed: usize, window: usize, block_size: usize) -> usize {
    (computed + 1).saturating_sub(window) / block_size
}

impl BlockManager {
    /// A pool for one KV group of every layer (no windows).
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self::with_groups(num_blocks, block_size, enable_prefix_caching, vec![None])
    }

    /// A pool shared by KV groups with these sliding windows (`KvGroups::windows`).
    pub fn with_groups(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        windows: Vec<Option<usize>>,
    ) -> Self {
        assert!(!windows.is_empty(), "a block pool needs at least one KV group");
        Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            clean: (0..num_blocks as u32).collect(),
            cached_free: BTreeMap::new(),
            tick: 0,
            cache: HashMap::new(),
            enable_prefix_caching,
            windows,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// KV groups sharing the pool.
    pub fn num_groups(&self) -> usize {
        self.windows.len()
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

    /// Group `g`'s cached block for the full block `chunk` of chained hash `h`.
    fn lookup(&self, h: u64, g: usize, chunk: &[u32]) -> Option<u32> {
        let &b = self.cache.get(&cache_key(h, g))?;
        let blk = &self.blocks[b as usize];
        (blk.group == g && blk.token_ids == chunk).then_some(b)
    }

    /// The longest run of cached full blocks that `tokens` starts with, leaving
    /// at least one token to compute: every block in each full group, the
    /// blocks the next token's window reads in each windowed group.
    pub fn cached_prefix(&self, tokens: &[u32]) -> CachedPrefix {
        let groups = self.windows.len();
        let mut out = CachedPrefix {
            blocks: vec![Vec::new(); groups],
            hashes: Vec::new(),
        };
        if !self.enable_prefix_caching || tokens.is_empty() {
            return out;
        }
        let bs = self.block_size;
        let max_full = (tokens.len() - 1) / bs;
        let mut hits: Vec<Vec<Option<u32>>> = vec![Vec::new(); groups];
        let mut parent = None;
        'blocks: for i in 0..max_full {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let h = block_hash(parent, chunk);
            let found: Vec<Option<u32>> = (0..groups).map(|g| self.lookup(h, g, chunk)).collect();
            if self.windows.iter().zip(&found).any(|(w, f)| w.is_none() && f.is_none()) {
                break 'blocks;
            }
            for (hit, f) in hits.iter_mut().zip(found) {
                hit.push(f);
            }
            out.hashes.push(h);
            parent = Some(h);
        }
        // Shorten until every windowed group holds what its window reads.
        let reads = |n: usize, g: usize| match self.windows[g] {
            None => 0..n,
            Some(w) => first_needed_block(n * bs, w, bs).min(n)..n,
        };
        let mut n = out.hashes.len();
        while n > 0 && !(0..groups).all(|g| reads(n, g).all(|j| hits[g][j].is_some())) {
            n -= 1;
        }
        out.hashes.truncate(n);
        for (g, blocks) in out.blocks.iter_mut().enumerate() {
            let from = reads(n, g).start;
            *blocks = (0..n)
                .map(|j| if j < from { FREED } else { hits[g][j].unwrap_or(FREED) })
                .collect();
        }
        out
    }

    /// Whether a new sequence can take the `cached` prefix and enough new blocks
    /// to hold `total_tokens`.
    pub fn can_allocate(&self, cached: &CachedPrefix, total_tokens: usize) -> bool {
        let revive = cached
            .blocks
            .iter()
            .flatten()
            .filter(|&&b| b != FREED && self.blocks[b as usize].ref_count == 0)
            .count();
        let new = total_tokens.div_ceil(self.block_size).saturating_sub(cached.len()) * self.windows.len();
        revive + new <= self.num_free_blocks()
    }

    /// Gives a new sequence its cached prefix and blocks for `total_tokens`.
    /// The caller checked `can_allocate`.
    pub fn allocate(&mut self, table: &mut BlockTable, cached: CachedPrefix, total_tokens: usize) {
        debug_assert!(table.is_empty());
        for &b in cached.blocks.iter().flatten() {
            if b != FREED {
                self.take_ref(b);
            }
        }
        table.blocks = cached.blocks;
        table.blocks.resize(self.windows.len(), Vec::new());
        table.hashes = cached.hashes;
        self.may_append(table, total_tokens);
    }

    /// Whether `table` can grow to hold `total_tokens`.
    pub fn can_append(&self, table: &BlockTable, total_tokens: usize) -> bool {
        total_tokens.div_ceil(self.block_size).saturating_sub(table.len()) * self.windows.len()
            <= self.num_free_blocks()
    }

    /// Grows `table` to hold `total_tokens` (the caller checked `can_append`).
    pub fn may_append(&mut self, table: &mut BlockTable, total_tokens: usize) {
        table.blocks.resize(self.windows.len(), Vec::new());
        while table.len() * self.block_size < total_tokens {
            for g in 0..self.windows.len() {
                let b = self.pop_free().expect("may_append without can_append");
                table.blocks[g].push(b);
            }
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

    /// Drops one reference to `b`; at zero it goes back to a free list.
    fn release(&mut self, b: u32) {
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

    /// Registers the full blocks among the first `num_computed` tokens of the sequence.
    pub fn cache_full_blocks(&mut self, table: &mut BlockTable, tokens: &[u32], num_computed: usize) {
        if !self.enable_prefix_caching {
            return;
        }
        let full = (num_computed / self.block_size).min(table.len());
        while table.hashes.len() < full {
            let i = table.hashes.len();
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let h = block_hash(table.hashes.last().copied(), chunk);
            for g in 0..table.blocks.len() {
                let b = table.blocks[g][i];
                let key = cache_key(h, g);
                if b == FREED || self.cache.contains_key(&key) {
                    continue;
                }
                let blk = &mut self.blocks[b as usize];
                if blk.hash.is_none() {
                    blk.hash = Some(key);
                    blk.token_ids = chunk.to_vec();
                    blk.group = g;
                    self.cache.insert(key, b);
                }
            }
            table.hashes.push(h);
        }
    }

    /// Releases the blocks of windowed groups that no token after the first
    /// `num_computed` reads (oldest first, so that the prefix cache evicts
    /// them first); their entries become `FREED`. Returns the blocks released.
    pub fn release_out_of_window(&mut self, table: &mut BlockTable, num_computed: usize) -> usize {
        let mut released = 0;
        for g in 0..table.blocks.len() {
            let Some(w) = self.windows[g] else { continue };
            let upto = first_needed_block(num_computed, w, self.block_size).min(table.blocks[g].len());
            // Released entries are a prefix of the table: start after it.
            let from = table.blocks[g][..upto]
                .iter()
                .rposition(|&b| b == FREED)
                .map_or(0, |j| j + 1);
            for j in from..upto {
                let b = std::mem::replace(&mut table.blocks[g][j], FREED);
                self.release(b);
                released += 1;
            }
        }
        released
    }

    /// After a step: registers the full blocks among the first `num_computed`
    /// tokens and releases the windowed groups' blocks no later token reads.
    pub fn note_computed(&mut self, table: &mut BlockTable, tokens: &[u32], num_computed: usize) {
        self.cache_full_blocks(table, tokens, num_computed);
        self.release_out_of_window(table, num_computed);
    }

    /// Releases the blocks past what `total_tokens` tokens need, tail first
    /// (speculative positions the model rejected; never a registered block:
    /// only computed full blocks are).
    pub fn truncate(&mut self, table: &mut BlockTable, total_tokens: usize) {
        let keep = total_tokens.div_ceil(self.block_size).max(table.hashes.len());
        while table.len() > keep {
            for g in 0..table.blocks.len() {
                if let Some(b) = table.blocks[g].pop()
                    && b != FREED
                {
                    self.release(b);
                }
            }
        }
    }

    /// Releases a sequence's blocks, tail first.
    pub fn deallocate(&mut self, table: &mut BlockTable) {
        for j in (0..table.len()).rev() {
            for g in 0..table.blocks.len() {
                let b = table.blocks[g][j];
                if b != FREED {
                    self.release(b);
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
            if !t.blocks.is_empty() && t.blocks.len() != self.windows.len() {
                return Err(format!(
                    "a table has {} groups, the pool {}",
                    t.blocks.len(),
                    self.windows.len()
                ));
            }
            for (g, row) in t.blocks.iter().enumerate() {
                if row.len() != t.len() {
                    return Err(format!("group {g} has {} blocks, group 0 {}", row.len(), t.len()));
                }
                if self.windows[g].is_none() && row.contains(&FREED) {
                    return Err(format!("group {g} attends to the whole context but released a block"));
                }
            }
            for b in t.held() {
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
