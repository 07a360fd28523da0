//! `KvGroups`: how the layers share the KV pool (vLLM's hybrid KV cache
//! manager). Layers that attend alike (the whole context, or the same sliding
//! window) form groups of equal size; a pool page holds one block of every
//! layer slot of a group, and each group has its own block table per sequence.
//! A windowed group's blocks that fall out of every window go back to the pool
//! (`BlockManager::release_out_of_window`), so Gemma 3's five local layers of
//! six cost a window's blocks, not the context's. A model without windows is
//! one group of every layer: one block table, a page per block, as before.

use crate::model::ModelConfig;

/// The groups of a model's layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroups {
    /// Each group's sliding window in tokens (`None`: the whole context).
    pub windows: Vec<Option<usize>>,
    /// Each layer's group and its slot within the group's page.
    pub layer_slot: Vec<(usize, usize)>,
    /// Layer slots in a page (the largest group's size).
    pub slots: usize,
}

impl KvGroups {
    /// One group of every layer: the flat layout (`hybrid` off, or no windows).
    pub fn flat(layers: usize) -> Self {
        Self {
            windows: vec![None],
            layer_slot: (0..layers).map(|l| (0, l)).collect(),
            slots: layers.max(1),
        }
    }

    /// The groups of `cfg`'s layers: flat unless `hybrid` and some layers attend
    /// differently from others (vLLM's uniform page size: the group size is the
    /// smallest attention type's layer count; a type whose count it does not
    /// divide leaves its last group's spare slots unused).
    pub fn of(cfg: &ModelConfig, hybrid: bool) -> Self {
        let windows: Vec<Option<usize>> = (0..cfg.layers).map(|l| cfg.spec.window(l)).collect();
        Self::of_windows(&windows, hybrid)
    }

    /// The groups of layers with these sliding windows (see `of`).
    pub fn of_windows(windows: &[Option<usize>], hybrid: bool) -> Self {
        let layers = windows.len();
        let mut kinds: Vec<Option<usize>> = windows.to_vec();
        kinds.sort();
        kinds.dedup();
        if !hybrid || kinds.len() < 2 {
            let mut g = Self::flat(layers);
            // Every layer alike: a windowed model frees its blocks out of the window too.
            g.windows = vec![if hybrid { kinds.first().copied().flatten() } else { None }];
            return g;
        }
        let of_kind = |k: &Option<usize>| (0..layers).filter(|&l| windows[l] == *k).collect::<Vec<_>>();
        let size = kinds.iter().map(|k| of_kind(k).len()).min().unwrap_or(1).max(1);
        let mut out = Self {
            windows: Vec::new(),
            layer_slot: vec![(0, 0); layers],
            slots: size,
        };
        for k in &kinds {
            for chunk in of_kind(k).chunks(size) {
                let g = out.windows.len();
                out.windows.push(*k);
                for (s, &l) in chunk.iter().enumerate() {
                    out.layer_slot[l] = (g, s);
                }
            }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Whether some group frees blocks out of its window.
    pub fn is_hybrid(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// Pool pages one sequence of `tokens` holds at most when a step computes
    /// up to `chunk` of its tokens: every block in a full group; in a windowed
    /// group of window w the blocks from the window's start to the chunk's end,
    /// at most ⌈(w - 1 + chunk) / block⌉ + 1 (vLLM's bound).
    pub fn pages_for(&self, tokens: usize, block_size: usize, chunk: usize) -> usize {
        let blocks = tokens.div_ceil(block_size);
        self.windows
            .iter()
            .map(|w| match w {
                None => blocks,
                Some(w) => blocks.min((w.saturating_sub(1) + chunk.max(1)).div_ceil(block_size) + 1),
            })
            .sum()
    }

    /// The longest sequence `pages` pool pages hold in steps of up to `chunk`
    /// tokens (`usize::MAX` when every group is windowed and a window fits).
    pub fn longest_fit(&self, pages: usize, block_size: usize, chunk: usize) -> usize {
        if self.pages_for(usize::MAX / 2, block_size, chunk) <= pages {
            return usize::MAX;
        }
        // pages_for grows with the token count: binary search on blocks.
        let (mut lo, mut hi) = (0usize, pages);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.pages_for(mid * block_size, block_size, chunk) <= pages {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo * block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's pattern: five windowed layers, then a global one.
    fn gemma3_like(layers: usize) -> Vec<Option<usize>> {
        (0..layers).map(|l| (l % 6 < 5).then_some(512)).collect()
    }

    #[test]
    fn gemma3_270m_pages_hold_three_layers() {
        let g = KvGroups::of_windows(&gemma3_like(18), true);
        assert_eq!(g.slots, 3);
        assert_eq!(g.len(), 6);
        assert_eq!(g.windows.iter().filter(|w| w.is_none()).count(), 1);
        // Every layer has its own (group, slot).
        let mut seen = g.layer_slot.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 18);
        for (l, &(grp, _)) in g.layer_slot.iter().enumerate() {
            assert_eq!(g.windows[grp].is_some(), l % 6 < 5, "layer {l}");
        }
    }

    #[test]
    fn uneven_counts_leave_spare_slots() {
        // Gemma 3 4B: 34 layers, 5 global, 29 local: 1 + 6 groups of 5 slots.
        let g = KvGroups::of_windows(&gemma3_like(34), true);
        assert_eq!((g.slots, g.len()), (5, 7));
        let flat = KvGroups::of_windows(&gemma3_like(34), false);
        assert_eq!((flat.slots, flat.len(), flat.windows[0]), (34, 1, None));
    }

    #[test]
    fn pages_and_longest_fit() {
        let g = KvGroups::of_windows(&gemma3_like(18), true);
        // 32k tokens of 16 decoding: 2048 blocks in the global group, 33 in each of five local ones.
        assert_eq!(g.pages_for(32768, 16, 1), 2048 + 5 * 33);
        assert_eq!(g.longest_fit(2048 + 5 * 33, 16, 1), 32768);
        assert_eq!(g.longest_fit(2048 + 5 * 33 - 1, 16, 1), 32768 - 16);
        // Steps of 512 tokens: a window and a chunk, ⌈1023/16⌉ + 1 = 65 blocks.
        assert_eq!(g.pages_for(32768, 16, 512), 2048 + 5 * 65);
        assert_eq!(g.pages_for(100, 16, 512), 6 * 7);
        // Every layer windowed (Mistral): a window's pages hold any length.
        let m = KvGroups::of_windows(&[Some(64); 4], true);
        assert_eq!((m.len(), m.windows[0]), (1, Some(64)));
        assert_eq!(m.longest_fit(5, 16, 1), usize::MAX);
        assert_eq!(m.longest_fit(4, 16, 1), 64);
        assert_eq!(KvGroups::flat(4).longest_fit(10, 16, 512), 160);
    }

    /// The bound holds for the block manager's own accounting: a windowed
    /// group's held blocks, before each step of a sequence advancing in chunks.
    #[test]
    fn windowed_hold_never_exceeds_the_bound() {
        use crate::engine::block_manager::first_needed_block;
        for (w, bs, chunk) in [
            (5usize, 4usize, 3usize),
            (512, 16, 512),
            (7, 1, 2),
            (33, 16, 1),
            (16, 16, 16),
        ] {
            let bound = (w - 1 + chunk).div_ceil(bs) + 1;
            let mut c = 0;
            while c < 2000 {
                let held = (c + chunk).div_ceil(bs) - first_needed_block(c, w, bs);
                assert!(held <= bound, "w {w} bs {bs} chunk {chunk} at {c}: {held} > {bound}");
                c += chunk;
            }
        }
    }
}
