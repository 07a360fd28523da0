//! The sampler on small logits with fixed seeds, one option at a time.

use rand::SeedableRng;
use rand::rngs::StdRng;
use wllm::SamplingParams;
use wllm::sampling::{apply_penalties, sample};

const LOGITS: [f32; 4] = [1.0, 3.0, 2.0, 0.5];

fn draw_counts(p: &SamplingParams, n: usize) -> [usize; 4] {
    let mut rng = StdRng::seed_from_u64(1);
    let mut c = [0; 4];
    for _ in 0..n {
        c[sample(&LOGITS, p, &[], &[], &mut rng).0 as usize] += 1;
    }
    c
}

#[test]
fn greedy_takes_the_argmax() {
    let p = SamplingParams::greedy();
    assert_eq!(sample(&LOGITS, &p, &[], &[], &mut StdRng::seed_from_u64(0)).0, 1);
}

#[test]
fn temperature_follows_the_softmax() {
    let p = SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    let c = draw_counts(&p, 20000);
    let z: f64 = LOGITS.iter().map(|&l| f64::from(l).exp()).sum();
    for i in 0..4 {
        let want = f64::from(LOGITS[i]).exp() / z;
        let got = c[i] as f64 / 20000.0;
        assert!((got - want).abs() < 0.015, "token {i}: {got} vs {want}");
    }
    // A low temperature concentrates on the argmax.
    let cold = draw_counts(
        &SamplingParams {
            temperature: 0.05,
            ..Default::default()
        },
        2000,
    );
    assert_eq!(cold[1], 2000);
}

#[test]
fn top_k_keeps_the_k_best() {
    let c = draw_counts(
        &SamplingParams {
            temperature: 1.0,
            top_k: 2,
            ..Default::default()
        },
        5000,
    );
    assert_eq!((c[0], c[3]), (0, 0));
    assert!(c[1] > c[2] && c[2] > 0);
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // Probabilities ≈ [0.086, 0.636, 0.234, 0.052]: top_p 0.7 keeps tokens 1 and 2.
    let c = draw_counts(
        &SamplingParams {
            temperature: 1.0,
            top_p: 0.7,
            ..Default::default()
        },
        5000,
    );
    assert_eq!((c[0], c[3]), (0, 0));
    assert!(c[2] > 0);
    let c = draw_counts(
        &SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        },
        1000,
    );
    assert_eq!(c[1], 1000);
}

#[test]
fn min_p_drops_tokens_below_the_floor() {
    // p(2)/p(1) ≈ 0.37, p(0)/p(1) ≈ 0.135: min_p 0.2 keeps tokens 1 and 2.
    let c = draw_counts(
        &SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            ..Default::default()
        },
        5000,
    );
    assert_eq!((c[0], c[3]), (0, 0));
    assert!(c[2] > 0);
}

#[test]
fn penalties_change_the_logits_as_documented() {
    let mut l = LOGITS.to_vec();
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..Default::default()
    };
    apply_penalties(&mut l, &p, &[1, 3, 1], &[]);
    assert_eq!(l, vec![1.0, 1.5, 2.0, 0.25]);
    let mut l = LOGITS.to_vec();
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..Default::default()
    };
    apply_penalties(&mut l, &p, &[0, 1, 1, 2], &[1, 1, 2]);
    assert_eq!(l, vec![1.0, 3.0 - 0.5 - 0.5, 2.0 - 0.5 - 0.25, 0.5]);
    // Greedy decoding sees the penalised logits.
    let p = SamplingParams {
        repetition_penalty: 4.0,
        ..SamplingParams::greedy()
    };
    assert_eq!(sample(&LOGITS, &p, &[1], &[1], &mut StdRng::seed_from_u64(0)).0, 2);
}

#[test]
fn same_seed_same_tokens() {
    let p = SamplingParams {
        temperature: 1.0,
        seed: Some(99),
        ..Default::default()
    };
    let run = || {
        let mut rng = p.rng();
        (0..50)
            .map(|_| sample(&LOGITS, &p, &[], &[], &mut rng).0)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
    let q = SamplingParams {
        seed: Some(100),
        ..p.clone()
    };
    let mut rng = q.rng();
    let other: Vec<u32> = (0..50).map(|_| sample(&LOGITS, &q, &[], &[], &mut rng).0).collect();
    assert_ne!(run(), other);
}

#[test]
fn logprobs_are_log_softmax_of_the_raw_logits() {
    let p = SamplingParams {
        logprobs: Some(2),
        ..SamplingParams::greedy()
    };
    let (tok, lp) = sample(&LOGITS, &p, &[], &[], &mut StdRng::seed_from_u64(0));
    let lp = lp.unwrap();
    let z: f64 = LOGITS.iter().map(|&l| f64::from(l).exp()).sum();
    let want = |i: usize| (f64::from(LOGITS[i]).exp() / z).ln() as f32;
    assert_eq!(tok, 1);
    assert!((lp.chosen.logprob - want(1)).abs() < 1e-6);
    assert_eq!(lp.top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 2]);
    assert!((lp.top[1].logprob - want(2)).abs() < 1e-6);
}

#[test]
fn bad_parameters_are_refused() {
    for p in [
        SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            min_p: 1.5,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
        SamplingParams {
            presence_penalty: 3.0,
            ..Default::default()
        },
        SamplingParams {
            max_tokens: Some(0),
            ..Default::default()
        },
        SamplingParams {
            stop: vec![String::new()],
            ..Default::default()
        },
    ] {
        assert!(p.validate().is_err(), "{p:?} should be refused");
    }
    assert!(SamplingParams::default().validate().is_ok());
}
