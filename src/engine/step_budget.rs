//! `StepBudget`: how many tokens the next step may batch, so that requests
//! already decoding are not stalled behind prefill chunks (Sarathi-Serve's
//! stall-free batching). The engine feeds it every step's measured time; it
//! fits `ms ≈ fixed + per_token · tokens` (least squares, older steps decaying)
//! and, when a step carries decodes, caps its tokens so that the step's
//! predicted time stays within the target: by default 1.5 × a decode step of
//! every live request (an inter-token latency with a prefill chunk in it is
//! then predicted at ~1.5 × a plain one; the fit is rough, so the margin to
//! the 3 × that matters is wide). Steps without decodes, and every step before
//! the fit has data, use the hard cap `max_num_batched_tokens` (vLLM's). The
//! engine's warm-up seeds the fit with timed steps.

pub use crate::config::StepTarget;

/// The auto target, in decode steps.
pub const AUTO_FACTOR: f64 = 1.5;

/// Least-squares fit of step milliseconds on batched tokens, each new step
/// weighing 1 and older ones decaying by `DECAY` per step.
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

const DECAY: f64 = 0.97;

impl StepCost {
    pub fn observe(&mut self, tokens: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        let x = tokens as f64;
        self.w = self.w * DECAY + 1.0;
        self.sx = self.sx * DECAY + x;
        self.sy = self.sy * DECAY + ms;
        self.sxx = self.sxx * DECAY + x * x;
        self.sxy = self.sxy * DECAY + x * ms;
    }

    /// The steps observed, each weighing 1 when new and decaying since.
    pub fn weight(&self) -> f64 {
        self.w
    }

    /// (fixed ms, ms per token), once steps of different sizes were seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.w * self.sxx - self.sx * self.sx;
        // Steps of one size only: no slope yet.
        if self.w < 2.0 || var <= 1e-6 * self.w * self.sxx.max(1.0) {
            return None;
        }
        let slope = (self.w * self.sxy - self.sx * self.sy) / var;
        let fixed = (self.sy - slope * self.sx) / self.w;
        (slope > 0.0).then_some((fixed.max(0.0), slope))
    }

    /// Predicted milliseconds of a step of `tokens`.
    pub fn predict(&self, tokens: usize) -> Option<f64> {
        self.fit().map(|(a, b)| a + b * tokens as f64)
    }
}

/// The target and the fitted cost.
#[derive(Clone, Debug, Default)]
pub struct StepBudget {
    pub target: StepTarget,
    pub cost: StepCost,
}

impl StepBudget {
    pub fn new(target: StepTarget) -> Self {
        Self {
            target,
            cost: StepCost::default(),
        }
    }

    /// Tokens the next step may batch: `hard_cap` without decodes, else as
    /// many as the target allows, and always every decode plus one block of
    /// prefill (`min_chunk`), so that prompts keep moving. A budget below the
    /// hard cap is a whole number of `min_chunk`s (a KV block, 16 tokens by
    /// default: also the row tile of the CPU adapters' batched gemms, whose
    /// last tile would otherwise run mostly empty: on lavapipe a step of 34
    /// rows costs 315 ms, one of 32 236 ms).
    pub fn max_tokens(&self, decodes: usize, live: usize, min_chunk: usize, hard_cap: usize) -> usize {
        if decodes == 0 {
            return hard_cap;
        }
        let Some((fixed, per_token)) = self.cost.fit() else {
            return hard_cap;
        };
        let decode_step = fixed + per_token * live.max(decodes) as f64;
        let target = match self.target {
            StepTarget::Off => return hard_cap,
            StepTarget::Ms(ms) => ms,
            StepTarget::Auto => AUTO_FACTOR * decode_step,
            StepTarget::Factor(f) => f * decode_step,
        };
        let fits = ((target - fixed) / per_token).floor().max(0.0) as usize;
        let g = min_chunk.max(1);
        (fits / g * g)
            .max((decodes + min_chunk).next_multiple_of(g))
            .min(hard_cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_cost() {
        let mut c = StepCost::default();
        assert_eq!(c.fit(), None);
        for i in 0..50 {
            let t = [1usize, 16, 64, 512][i % 4];
            c.observe(t, 30.0 + 6.5 * t as f64);
        }
        let (a, b) = c.fit().unwrap();
        assert!((a - 30.0).abs() < 1e-6 && (b - 6.5).abs() < 1e-9, "{a} {b}");
        // One step size only: no slope to fit.
        let mut one = StepCost::default();
        (0..10).for_each(|_| one.observe(16, 100.0));
        assert_eq!(one.fit(), None);
    }

    #[test]
    fn steps_with_decodes_stay_near_the_target() {
        let mut b = StepBudget::new(StepTarget::Auto);
        assert_eq!(b.max_tokens(16, 16, 16, 512), 512, "no data: the hard cap");
        for t in [1usize, 16, 128, 512, 16, 1] {
            b.cost.observe(t, 30.0 + 6.5 * t as f64);
        }
        assert_eq!(b.max_tokens(0, 16, 16, 512), 512, "no decodes: the hard cap");
        let n = b.max_tokens(16, 16, 4, 512);
        let decode_step = b.cost.predict(16).unwrap();
        let step = b.cost.predict(n).unwrap();
        assert!(
            step <= AUTO_FACTOR * decode_step + 1e-9 && n > 16,
            "{n} tokens: {step} ms vs {decode_step}"
        );
        // The most whole chunks of 4 within the target.
        assert!(n.is_multiple_of(4) && b.cost.predict(n + 4).unwrap() > AUTO_FACTOR * decode_step);
        // Whole blocks: 16-token blocks, 5 decodes of 64 live requests: the
        // most whole blocks within the target.
        let m = b.max_tokens(5, 64, 16, 512);
        let target = AUTO_FACTOR * b.cost.predict(64).unwrap();
        assert!(m.is_multiple_of(16), "{m}");
        assert!(
            b.cost.predict(m).unwrap() <= target && b.cost.predict(m + 16).unwrap() > target,
            "{m}"
        );
        // A tight target still lets every decode and one block of prefill
        // through, rounded up to whole blocks.
        b.target = StepTarget::Ms(1.0);
        assert_eq!(b.max_tokens(16, 16, 16, 512), 32);
        assert_eq!(b.max_tokens(5, 16, 16, 512), 32);
        assert_eq!(b.max_tokens(5, 16, 1, 512), 6);
        // A factor: the most whole blocks within that many decode steps.
        b.target = StepTarget::Factor(3.0);
        let f = b.max_tokens(5, 64, 16, 512);
        let target = 3.0 * b.cost.predict(64).unwrap();
        assert!(f > m && f.is_multiple_of(16), "{f} vs {m}");
        assert!(
            b.cost.predict(f).unwrap() <= target && b.cost.predict(f + 16).unwrap() > target,
            "{f}"
        );
        b.target = StepTarget::Off;
        assert_eq!(b.max_tokens(16, 16, 16, 512), 512);
        // Never above the hard cap.
        b.target = StepTarget::Ms(1e9);
        assert_eq!(b.max_tokens(16, 16, 16, 256), 256);
    }

    #[test]
    fn targets_parse() {
        assert_eq!("auto".parse::<StepTarget>(), Ok(StepTarget::Auto));
        assert_eq!("OFF".parse::<StepTarget>(), Ok(StepTarget::Off));
        assert_eq!("250".parse::<StepTarget>(), Ok(StepTarget::Ms(250.0)));
        assert_eq!("2.5x".parse::<StepTarget>(), Ok(StepTarget::Factor(2.5)));
        assert_eq!(StepTarget::Factor(2.5).to_string(), "2.5x");
        assert!("0.5x".parse::<StepTarget>().is_err());
        assert!("x".parse::<StepTarget>().is_err());
        assert!("-3".parse::<StepTarget>().is_err());
        assert!("fast".parse::<StepTarget>().is_err());
    }
}
