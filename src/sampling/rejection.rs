//! Speculative sampling with a deterministic draft (Leviathan et al., Chen et
//! al.; vLLM's rejection sampler with the n-gram proposer): a drafted token
//! `d` at a position whose target distribution is `p` is accepted with
//! probability min(1, p(d) / q(d)) = p(d) (the draft puts all its mass on
//! `d`, q(d) = 1); when rejected, the token is drawn from the residual
//! max(0, p − q) renormalised, which is `p` with `d` taken out. The token
//! that comes out is distributed as `p`, whatever the draft.

use rand::Rng;
use rand::rngs::StdRng;

use super::draw;

/// What became of one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Rejected, and this token drawn in its place.
    Resampled(u32),
}

/// Accepts `draft` against the target distribution (`ids` with `probs`, as
/// `filtered_probs` gives: summing to 1), or draws the replacement.
pub fn accept_or_resample(ids: &[usize], probs: &[f64], draft: u32, rng: &mut StdRng) -> Verdict {
    let at = ids.iter().position(|&t| t == draft as usize);
    let p_draft = at.map_or(0.0, |i| probs[i]);
    if rng.random::<f64>() < p_draft {
        return Verdict::Accepted;
    }
    // The residual: p without the draft. A draft holding all of p is always
    // accepted above (the draw is below 1), so some mass is left here.
    let mut residual = probs.to_vec();
    if let Some(i) = at {
        residual[i] = 0.0;
    }
    Verdict::Resampled(ids[draw(&residual, rng)] as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The first token out of "draft d, verify against p" is distributed as
    /// p, for a draft p favours, one it disfavours and one it excludes.
    #[test]
    fn the_token_out_follows_the_target_whatever_the_draft() {
        let ids = [7usize, 3, 9, 4];
        let probs = [0.5, 0.3, 0.15, 0.05];
        let n = 200_000;
        for draft in [7u32, 4, 11] {
            let mut rng = StdRng::seed_from_u64(u64::from(draft));
            let mut counts = [0usize; 4];
            for _ in 0..n {
                let t = match accept_or_resample(&ids, &probs, draft, &mut rng) {
                    Verdict::Accepted => draft,
                    Verdict::Resampled(t) => {
                        assert_ne!(t, draft, "a rejected draft is never drawn again");
                        t
                    }
                };
                let i = ids.iter().position(|&x| x == t as usize).expect("a token of p");
                counts[i] += 1;
            }
            // Pearson's chi-square against p, 3 degrees of freedom: 16.27 is p = 0.001.
            let chi2: f64 = counts
                .iter()
                .zip(probs)
                .map(|(&c, q)| (c as f64 - q * n as f64).powi(2) / (q * n as f64))
                .sum();
            assert!(chi2 < 16.27, "draft {draft}: counts {counts:?}, chi-square {chi2:.1}");
        }
    }

    #[test]
    fn a_draft_with_all_the_mass_is_always_accepted() {
        let mut rng = StdRng::seed_from_u64(0);
        for _ in 0..1000 {
            assert_eq!(accept_or_resample(&[5], &[1.0], 5, &mut rng), Verdict::Accepted);
        }
        // And a draft outside p never is.
        for _ in 0..1000 {
            assert_eq!(accept_or_resample(&[5], &[1.0], 6, &mut rng), Verdict::Resampled(5));
        }
    }
}
