//! `wllm bench soak --duration 120s`: a server left under a mixed load —
//! prompts short and long, streaming and not, n > 1, stop strings, clients
//! that disconnect mid-stream, bad requests mixed in — then the figures that
//! say whether it can be left running: requests ok / rejected / aborted /
//! failed, KV blocks leaked (must be 0), RSS after warm-up and at the end, ITL
//! p99. Exits non-zero on a leak, a failed request or a broken block pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use wllm::client;
use wllm::metrics::percentile;

use super::EngineArgs;

#[derive(Args, Clone, Debug)]
pub struct BenchSoakArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// How long to run: seconds, or with a unit (90s, 2m).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Clients sending at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, mul) = match s.strip_suffix('m') {
        Some(n) => (n, 60.0),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v * mul)),
        _ => Err(format!("{s:?} is not a duration (e.g. 120s, 2m)")),
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    rejected: AtomicU64,
    overloaded: AtomicU64,
    aborted: AtomicU64,
    failed: AtomicU64,
}

const WORDS: [&str; 16] = [
    "the", "river", "engine", "quietly", "paged", "cache", "blocks", "of", "light", "and", "token", "steps", "over",
    "a", "green", "hill",
];

fn text(r: &mut StdRng, words: usize) -> String {
    (0..words)
        .map(|_| WORDS[r.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One client's loop until `end`; returns the ITLs of its streamed completions.
async fn client_loop(
    base: String,
    model: String,
    seed: u64,
    end: Instant,
    c: Arc<Counts>,
    max_words: usize,
) -> Vec<f64> {
    let mut r = StdRng::seed_from_u64(seed);
    let mut itls = Vec::new();
    let (comp, chat) = (format!("{base}/v1/completions"), format!("{base}/v1/chat/completions"));
    while Instant::now() < end {
        let words = if r.random_bool(0.2) {
            r.random_range(200..600)
        } else {
            r.random_range(2..40)
        };
        let words = words.min(max_words);
        let prompt = text(&mut r, words);
        let max_tokens = r.random_range(1..48);
        let kind = r.random_range(0..100);
        let outcome: anyhow::Result<&str> = async {
            if kind < 10 {
                // Bad requests: each must come back as a 4xx OpenAI error.
                let bodies = [
                    "{\"prompt\": ".to_string(),
                    json!({"model": model, "messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
                    json!({"model": model, "prompt": "hi", "n": 0}).to_string(),
                    json!({"model": model, "prompt": "hi", "max_tokens": u64::MAX}).to_string(),
                    json!({"model": model, "prompt": "hi", "logit_bias": {"1": 3}}).to_string(),
                ];
                let (st, body) = client::post_raw(&comp, &bodies[r.random_range(0..bodies.len())]).await?;
                let v: Value = serde_json::from_str(&body).unwrap_or_default();
                if (400..500).contains(&st) && v["error"]["message"].is_string() {
                    return Ok("rejected");
                }
                bail!("a bad request got {st}: {body}");
            }
            if kind < 55 {
                // Streamed: chat that may disconnect early, or a completion read to the end.
                let drop_after = (kind < 25).then(|| r.random_range(1..4));
                let (url, body) = if kind < 25 {
                    let m = json!([{"role": "user", "content": prompt}]);
                    (
                        &chat,
                        json!({"model": model, "messages": m, "max_tokens": max_tokens, "stream": true}),
                    )
                } else {
                    (
                        &comp,
                        json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": true}),
                    )
                };
                let mut resp = client::post_stream(url, &body).await?;
                if resp.status == 503 {
                    return Ok("overloaded");
                }
                if resp.status != 200 {
                    let st = resp.status;
                    bail!("stream got {st}: {}", resp.text().await?);
                }
                let (mut last, mut chunks) = (None::<Instant>, 0);
                while let Some(ev) = resp.next_event().await? {
                    if ev == "[DONE]" {
                        return Ok("ok");
                    }
                    let v: Value = serde_json::from_str(&ev).with_context(|| format!("chunk {ev:?}"))?;
                    if v.get("error").is_some() {
                        bail!("stream error: {ev}");
                    }
                    chunks += 1;
                    if drop_after.is_some_and(|d| chunks >= d) {
                        return Ok("aborted");
                    }
                    let now = Instant::now();
                    if let Some(t) = last
                        && drop_after.is_none()
                    {
                        itls.push(now.duration_since(t).as_secs_f64());
                    }
                    last = Some(now);
                }
                bail!("a stream ended without [DONE]");
            }
            // Not streamed: n > 1 and stop strings, or a chat.
            let (url, body) = if kind < 80 {
                let n = r.random_range(1..4);
                (
                    &comp,
                    json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "n": n, "stop": [" of", "\n"]}),
                )
            } else {
                let m = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]);
                (
                    &chat,
                    json!({"model": model, "messages": m, "max_tokens": max_tokens, "temperature": 0.8}),
                )
            };
            let (st, v) = client::post_json(url, &body).await?;
            match st {
                200 if v["choices"].is_array() => Ok("ok"),
                503 => Ok("overloaded"),
                _ => bail!("got {st}: {v}"),
            }
        }
        .await;
        let counter = match outcome {
            Ok("ok") => &c.ok,
            Ok("rejected") => &c.rejected,
            Ok("overloaded") => &c.overloaded,
            Ok(_) => &c.aborted,
            Err(e) => {
                eprintln!("soak: {e:#}");
                &c.failed
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    itls
}

fn rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

pub fn run(a: &BenchSoakArgs) -> anyhow::Result<()> {
    if a.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let engine = a.engine.start_warm()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}", listener.local_addr()?);
    let cfg = wllm::server::ServerConfig {
        served_model_name: "soak".into(),
        ..Default::default()
    };
    rt.spawn(wllm::server::serve_on(listener, engine.clone(), cfg));
    // Long prompts stay well inside the context (a word is a few tokens at most).
    let max_words = (engine.kv_plan().max_model_len / 8).max(2);
    let counts = Arc::new(Counts::default());
    let t0 = Instant::now();
    let end = t0 + a.duration;
    eprintln!(
        "soak: {} clients for {:.0} s against {base}",
        a.concurrency,
        a.duration.as_secs_f64()
    );
    let handles: Vec<_> = (0..a.concurrency)
        .map(|i| {
            let (b, c) = (base.clone(), counts.clone());
            rt.spawn(client_loop(
                b,
                "soak".into(),
                a.seed * 1000 + i as u64,
                end,
                c,
                max_words,
            ))
        })
        .collect();
    // RSS after warm-up: a tenth of the way in.
    std::thread::sleep(a.duration / 10);
    let rss_warm = rss();
    let mut itls: Vec<f64> = Vec::new();
    for h in handles {
        itls.extend(rt.block_on(h).context("a soak client panicked")?);
    }
    let rss_end = rss();
    // Let aborted requests drain, then count the blocks nobody holds.
    let t1 = Instant::now();
    let stats = loop {
        let s = engine.block_stats()?;
        if s.num_live_sequences == 0 || t1.elapsed() > Duration::from_secs(30) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let leaked = stats.num_blocks - stats.num_free;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let itl_p99 = percentile(&itls, 99.0).map_or(f64::NAN, |v| v * 1e3);
    let mib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / 1048576.0);
    let figures = json!({
        "seconds": t0.elapsed().as_secs_f64(),
        "concurrency": a.concurrency,
        "requests_ok": ld(&counts.ok),
        "requests_rejected": ld(&counts.rejected),
        "requests_overloaded": ld(&counts.overloaded),
        "requests_aborted": ld(&counts.aborted),
        "requests_failed": ld(&counts.failed),
        "blocks_leaked": leaked,
        "live_sequences_left": stats.num_live_sequences,
        "block_pool": stats.consistent.as_ref().map_or_else(|e| e.clone(), |()| "consistent".into()),
        "rss_after_warmup_mib": mib(rss_warm),
        "rss_end_mib": mib(rss_end),
        "itl_p99_ms": itl_p99,
    });
    println!(
        "soak {:.0} s, {} clients: {} ok, {} rejected (bad requests), {} overloaded (503), {} aborted (client left), \
         {} failed; blocks leaked {}; RSS {:.1} MiB after warm-up, {:.1} MiB at the end; ITL p99 {:.1} ms",
        t0.elapsed().as_secs_f64(),
        a.concurrency,
        ld(&counts.ok),
        ld(&counts.rejected),
        ld(&counts.overloaded),
        ld(&counts.aborted),
        ld(&counts.failed),
        leaked,
        mib(rss_warm),
        mib(rss_end),
        itl_p99
    );
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if leaked > 0 || stats.num_live_sequences > 0 || ld(&counts.failed) > 0 || stats.consistent.is_err() {
        bail!("the soak found problems: {figures}");
    }
    a.engine.write_trace(&engine)
}
