//! Perplexity as llama.cpp's `llama-perplexity` measures it: the text's tokens
//! cut into windows of `ctx`, the first token of each replaced by BOS when the
//! model adds one, each window run from an empty cache, and only its second
//! half scored (every scored token sees at least ctx/2 tokens of context):
//! PPL = exp(mean over scored tokens of −log p(token | the window before it)).
//! The window runs in chunks of the engine's step budget with a logits row per
//! scored position (`SeqChunk::logits_from`); log-softmax is taken in f64.

use super::{BlockTable, CachedPrefix, EngineError, LlmEngine, SeqChunk};

/// The running result.
#[derive(Clone, Copy, Debug, Default)]
pub struct Perplexity {
    pub windows: usize,
    pub scored: usize,
    /// Σ −log p and Σ (−log p)² over scored tokens.
    pub nll: f64,
    pub nll2: f64,
}

impl Perplexity {
    pub fn value(&self) -> f64 {
        (self.nll / self.scored.max(1) as f64).exp()
    }

    /// llama.cpp's ± (standard error of the mean NLL carried through exp).
    pub fn uncertainty(&self) -> f64 {
        let (mean, se) = mean_and_error(self.nll, self.nll2, self.scored);
        mean.exp() * se
    }
}

/// The mean of n values from their sum and sum of squares, and the standard
/// error of that mean (NaN under two values).
fn mean_and_error(sum: f64, sum2: f64, n: usize) -> (f64, f64) {
    let n = n as f64;
    let mean = sum / n.max(1.0);
    if n < 2.0 {
        return (mean, f64::NAN);
    }
    let var = (sum2 / n - mean * mean).max(0.0);
    (mean, (var / (n - 1.0)).sqrt())
}

impl LlmEngine {
    /// −log p(tokens[p + 1]) for every p in `first..tokens.len() - 1`, the
    /// window run from an empty cache. The engine must be idle.
    pub fn score_window(&mut self, tokens: &[u32], first: usize) -> Result<Vec<f64>, EngineError> {
        let mut out = Vec::with_capacity(tokens.len().saturating_sub(first + 1));
        self.window_logits(tokens, first, |p, row| {
            out.push(neg_log_softmax(row, tokens[p + 1] as usize))
        })?;
        Ok(out)
    }

    /// The log-softmax rows (f32) of positions `first..tokens.len() - 1`, the
    /// window run from an empty cache: the next-token distributions a KL
    /// divergence compares.
    pub fn window_log_probs(&mut self, tokens: &[u32], first: usize) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = Vec::new();
        self.window_logits(tokens, first, |_, row| out.push(log_softmax(row)))?;
        Ok(out)
    }

    /// Runs a window from an empty cache; `row(p, logits)` for every p in
    /// `first..tokens.len() - 1`, in order.
    fn window_logits(
        &mut self,
        tokens: &[u32],
        first: usize,
        mut row_of: impl FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if self.has_unfinished() {
            return Err(EngineError::Config(
                "scoring needs an engine with no requests running".into(),
            ));
        }
        let n = tokens.len();
        let bs = self.plan.block_size;
        let step = self
            .scheduler
            .cfg
            .max_num_batched_tokens
            .min(self.scheduler.cfg.max_num_seqs);
        let groups = self.scheduler.blocks.num_groups();
        if n > self.plan.max_model_len || n.div_ceil(bs) * groups > self.scheduler.blocks.num_free_blocks() {
            return Err(EngineError::Config(format!(
                "a window of {n} tokens does not fit (max model length {}, {} free KV blocks of {bs})",
                self.plan.max_model_len,
                self.scheduler.blocks.num_free_blocks()
            )));
        }
        let mut table = BlockTable::default();
        self.scheduler.blocks.allocate(&mut table, CachedPrefix::default(), n);
        let vocab = self.model_config.vocab;
        let mut result = Ok(());
        for start in (0..n).step_by(step.max(1)) {
            let len = step.min(n - start);
            let chunk = SeqChunk {
                token_ids: tokens,
                start,
                len,
                block_tables: &table.blocks,
                sample: false,
                logits_from: Some(first),
                hidden: false,
            };
            let from = start.max(first);
            let rows = (start + len).saturating_sub(from);
            let r = match self.runner.execute(&[chunk], rows > 0) {
                Ok(r) => r,
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            };
            if let Some(logits) = r.logits {
                for (i, row) in logits.chunks_exact(vocab).enumerate() {
                    let p = from + i;
                    if p + 1 < n {
                        row_of(p, row);
                    }
                }
            }
        }
        self.scheduler.blocks.deallocate(&mut table);
        result
    }

    /// Perplexity of `tokens` in windows of `ctx` (at most `max_windows`);
    /// `progress(windows done, windows, running value)` after each window.
    pub fn perplexity(
        &mut self,
        tokens: &[u32],
        ctx: usize,
        max_windows: Option<usize>,
        mut progress: impl FnMut(usize, usize, &Perplexity),
    ) -> Result<Perplexity, EngineError> {
        let windows = self.windows_of(tokens, ctx, max_windows)?;
        let mut ppl = Perplexity::default();
        for w in 0..windows {
            let win = self.window(tokens, ctx, w);
            for v in self.score_window(&win, ctx / 2)? {
                ppl.nll += v;
                ppl.nll2 += v * v;
                ppl.scored += 1;
            }
            ppl.windows += 1;
            progress(w + 1, windows, &ppl);
        }
        Ok(ppl)
    }

    /// How many windows of `ctx` the text gives (at most `max_windows`), or
    /// why it cannot be scored.
    fn windows_of(&self, tokens: &[u32], ctx: usize, max_windows: Option<usize>) -> Result<usize, EngineError> {
        if ctx < 4 {
            return Err(EngineError::Config(format!("--ctx {ctx} is too small (at least 4)")));
        }
        let windows = (tokens.len() / ctx).min(max_windows.unwrap_or(usize::MAX));
        if windows == 0 {
            return Err(EngineError::Config(format!(
                "the text has {} tokens; perplexity needs at least one window of --ctx {ctx}",
                tokens.len()
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.model_config.vocab) {
            return Err(EngineError::Config(format!(
                "token {t} is outside the model's vocabulary of {}",
                self.model_config.vocab
            )));
        }
        Ok(windows)
    }

    /// Window `w` of `ctx` tokens, its first replaced by BOS where the model adds one.
    fn window(&self, tokens: &[u32], ctx: usize, w: usize) -> Vec<u32> {
        let mut win = tokens[w * ctx..(w + 1) * ctx].to_vec();
        if let Some(b) = self.tokenizer.add_bos.then_some(self.tokenizer.bos_id).flatten() {
            win[0] = b;
        }
        win
    }

    /// `perplexity`, and the KL divergence of this engine's next-token
    /// distributions from `base`'s (the same model under other settings, e.g.
    /// an f32 KV cache) over the scored positions, as llama-perplexity's
    /// `--kl-divergence` reports it: mean KL and how often the top tokens agree.
    pub fn perplexity_against(
        &mut self,
        base: &mut LlmEngine,
        tokens: &[u32],
        ctx: usize,
        max_windows: Option<usize>,
        mut progress: impl FnMut(usize, usize, &Perplexity, &KlStats),
    ) -> Result<(Perplexity, KlStats), EngineError> {
        let windows = self.windows_of(tokens, ctx, max_windows)?;
        let (mut ppl, mut kl) = (Perplexity::default(), KlStats::default());
        for w in 0..windows {
            let win = self.window(tokens, ctx, w);
            let p = base.window_log_probs(&win, ctx / 2)?;
            let q = self.window_log_probs(&win, ctx / 2)?;
            for (i, (p, q)) in p.iter().zip(&q).enumerate() {
                let target = win[ctx / 2 + i + 1] as usize;
                let v = -f64::from(q[target]);
                ppl.nll += v;
                ppl.nll2 += v * v;
                ppl.scored += 1;
                let base_v = -f64::from(p[target]);
                kl.base_nll += base_v;
                kl.dnll += v - base_v;
                kl.dnll2 += (v - base_v) * (v - base_v);
                let d = kl_divergence(p, q);
                kl.sum += d;
                kl.max = kl.max.max(d);
                kl.same_top += usize::from(argmax(p) == argmax(q));
                kl.n += 1;
            }
            ppl.windows += 1;
            progress(w + 1, windows, &ppl, &kl);
        }
        Ok((ppl, kl))
    }
}

/// KL divergence of one run's next-token distributions from another's.
#[derive(Clone, Copy, Debug, Default)]
pub struct KlStats {
    pub n: usize,
    pub sum: f64,
    pub max: f64,
    /// Positions whose most likely token is the same in both.
    pub same_top: usize,
    /// Σ −log p of the scored tokens under the base, and Σ and Σ² of the
    /// per-token difference (this run's −log p minus the base's): the paired
    /// statistics that tell a real change of perplexity from the text's noise.
    pub base_nll: f64,
    pub dnll: f64,
    pub dnll2: f64,
}

impl KlStats {
    pub fn mean(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }

    pub fn same_top_fraction(&self) -> f64 {
        self.same_top as f64 / self.n.max(1) as f64
    }

    /// The base's perplexity over the same scored tokens.
    pub fn base_ppl(&self) -> f64 {
        (self.base_nll / self.n.max(1) as f64).exp()
    }

    /// ln(PPL / PPL_base), the mean per-token difference of −log p, and its
    /// standard error (llama-perplexity's "Mean ln(PPL(Q)/PPL(base))"); the
    /// error is NaN under two positions.
    pub fn ln_ppl_ratio(&self) -> (f64, f64) {
        mean_and_error(self.dnll, self.dnll2, self.n)
    }

    /// PPL − PPL_base given this run's `ppl`, with its standard error (the
    /// paired error of the log ratio carried through exp).
    pub fn delta_ppl(&self, ppl: f64) -> (f64, f64) {
        let (_, se) = self.ln_ppl_ratio();
        (ppl - self.base_ppl(), ppl * se)
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) },
        )
        .0
}

/// log softmax(row), computed in f64, kept in f32.
fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&v| (v as f64 - lse) as f32).collect()
}

/// KL(P ‖ Q) = Σ p (log p − log q) of two log-probability rows, in f64.
pub fn kl_divergence(log_p: &[f32], log_q: &[f32]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .map(|(&a, &b)| {
            let (a, b) = (f64::from(a), f64::from(b));
            if a == f64::NEG_INFINITY { 0.0 } else { a.exp() * (a - b) }
        })
        .sum()
}

/// −log softmax(row)[target], in f64.
fn neg_log_softmax(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - row[target] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_statistics_give_the_log_ratio_and_its_error() {
        // Base −log p of 1, 2, 3, 2; this run's 1.1, 2.0, 3.3, 2.2: differences .1, 0, .3, .2.
        let (base, run) = ([1.0, 2.0, 3.0, 2.0], [1.1, 2.0, 3.3, 2.2]);
        let mut kl = KlStats::default();
        for (b, r) in base.iter().zip(run) {
            kl.n += 1;
            kl.base_nll += b;
            kl.dnll += r - b;
            kl.dnll2 += (r - b) * (r - b);
        }
        let (m, se) = kl.ln_ppl_ratio();
        assert!((m - 0.15).abs() < 1e-12, "{m}");
        // Sample variance of .1, 0, .3, .2 is 0.05/3; the error of the mean sqrt(0.05/3/4).
        assert!((se - (0.05f64 / 12.0).sqrt()).abs() < 1e-12, "{se}");
        assert!((kl.base_ppl() - 2f64.exp()).abs() < 1e-12);
        let ppl = 2.15f64.exp();
        let (d, d_se) = kl.delta_ppl(ppl);
        assert!((d - (2.15f64.exp() - 2f64.exp())).abs() < 1e-12);
        assert!((d_se - ppl * se).abs() < 1e-12);
        assert!(KlStats::default().ln_ppl_ratio().1.is_nan());
    }
}
