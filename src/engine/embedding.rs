//! Embeddings: a prefill-only sequence whose prompt's final hidden states
//! (after the model's output norm, as llama.cpp's embeddings read them) are
//! pooled into one vector instead of sampling a token. The step that
//! computes an embedding sequence's chunk hands back that chunk's rows
//! (`SeqChunk::hidden`); `Pooler` folds them in, in position order, in f64,
//! so the vector is the same whatever the chunking or the batch beside it.
//! Mean and cls pooling need every position's row, so those sequences take
//! no prefix-cache hits (they still leave their blocks in the cache); last
//! pooling needs only the last row and takes them.

use std::time::Instant;

use super::{FinishReason, RequestOutput, SeqStatus, Sequence};
use crate::config::{EmbedSpec, Pooling};
use crate::metrics::Metrics;

/// One embedding sequence's pooling so far.
#[derive(Clone, Debug)]
pub struct Pooler {
    pub spec: EmbedSpec,
    /// Sum of the rows (mean), or the row kept (cls, last), in f64.
    acc: Vec<f64>,
    /// Positions folded in (mean, cls: from 0 on).
    rows: usize,
}

impl Pooler {
    pub fn new(spec: EmbedSpec) -> Self {
        Self {
            spec,
            acc: Vec::new(),
            rows: 0,
        }
    }

    /// Whether every position's row is needed (no prefix-cache hits).
    pub fn needs_every_row(&self) -> bool {
        self.spec.pooling != Pooling::Last
    }

    /// Folds in the rows of positions `start..start + rows.len() / hidden`
    /// (`hidden` floats a row). A chunk from position 0 starts over (a
    /// preempted sequence recomputes its prompt).
    pub fn add(&mut self, start: usize, rows: &[f32], hidden: usize) {
        let n = rows.len() / hidden.max(1);
        if n == 0 {
            return;
        }
        if start == 0 || self.acc.len() != hidden {
            self.acc = vec![0.0; hidden];
            self.rows = 0;
        }
        match self.spec.pooling {
            Pooling::Mean => {
                for row in rows.chunks_exact(hidden) {
                    for (a, &v) in self.acc.iter_mut().zip(row) {
                        *a += f64::from(v);
                    }
                }
                self.rows = start + n;
            }
            Pooling::Cls => {
                if start == 0 {
                    self.acc = rows[..hidden].iter().map(|&v| f64::from(v)).collect();
                }
                self.rows = start + n;
            }
            Pooling::Last => {
                self.acc = rows[(n - 1) * hidden..].iter().map(|&v| f64::from(v)).collect();
                self.rows = start + n;
            }
        }
    }

    /// The embedding of a prompt of `len` tokens, all folded in.
    pub fn finish(&self, len: usize) -> Vec<f32> {
        let scale = match self.spec.pooling {
            Pooling::Mean => 1.0 / len.max(1) as f64,
            _ => 1.0,
        };
        let mut v: Vec<f64> = self.acc.iter().map(|a| a * scale).collect();
        if self.spec.normalize {
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x /= norm);
            }
        }
        debug_assert!(self.rows == len || self.spec.pooling == Pooling::Last);
        v.into_iter().map(|x| x as f32).collect()
    }
}

/// An embedding sequence whose prompt is computed: finished, with its
/// vector as its one output (the engine frees its blocks).
pub(super) fn finish(seq: &mut Sequence, embedding: Vec<f32>, now: Instant, metrics: &mut Metrics) -> RequestOutput {
    seq.status = SeqStatus::Finished(FinishReason::Stop);
    seq.times.first_token = Some(now);
    seq.times.last_token = Some(now);
    metrics.prompt_tokens_total += seq.prompt_len as u64;
    metrics.embedding_requests_total += 1;
    RequestOutput {
        id: seq.id,
        finish_reason: Some(FinishReason::Stop),
        num_prompt_tokens: seq.prompt_len,
        embedding: Some(embedding),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pooling: Pooling, normalize: bool) -> EmbedSpec {
        EmbedSpec { pooling, normalize }
    }

    #[test]
    fn pooling_folds_rows_in_whatever_the_chunks() {
        // Three positions of two values: [1, 2], [3, 4], [5, 12].
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 12.0];
        for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            let mut whole = Pooler::new(spec(pooling, false));
            whole.add(0, &rows, 2);
            let mut parts = Pooler::new(spec(pooling, false));
            // A preempted first attempt, then the prompt in two chunks.
            parts.add(0, &[9.0, 9.0], 2);
            parts.add(0, &rows[..2], 2);
            parts.add(1, &rows[2..], 2);
            assert_eq!(whole.finish(3), parts.finish(3), "{pooling}");
        }
        let mut p = Pooler::new(spec(Pooling::Mean, false));
        p.add(0, &rows, 2);
        assert_eq!(p.finish(3), vec![3.0, 6.0]);
        let mut p = Pooler::new(spec(Pooling::Last, true));
        // Last pooling after a prefix-cache hit: only the last chunk comes.
        p.add(2, &rows[4..], 2);
        assert_eq!(p.finish(3), vec![5.0 / 13.0, 12.0 / 13.0]);
        let mut p = Pooler::new(spec(Pooling::Cls, true));
        p.add(0, &rows, 2);
        let v = p.finish(3);
        assert!((v[0] - 1.0 / 5f32.sqrt()).abs() < 1e-7 && (v[1] - 2.0 / 5f32.sqrt()).abs() < 1e-7);
        assert!(p.needs_every_row() && !Pooler::new(spec(Pooling::Last, true)).needs_every_row());
    }
}
