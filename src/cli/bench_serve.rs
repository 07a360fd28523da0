//! `wllm bench serve`: the seed's experiment — fixed input and output lengths,
//! rising concurrency — over the OpenAI-compatible HTTP API with streaming, so
//! any server can be measured the same way (`--base-url`). Without it, wllm is
//! started in-process behind its own server on a local port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use serde_json::{Value, json};
use wllm::client;
use wllm::metrics::percentile;

use super::EngineArgs;
use super::bench_workload::{self, Workload};
use super::plot::Level;

#[derive(Args, Clone, Debug)]
pub struct BenchServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// An OpenAI-compatible server to measure, e.g. http://127.0.0.1:8000 (default: wllm in-process).
    #[arg(long)]
    pub base_url: Option<String>,
    /// The model name to send (default: the first of /v1/models).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Requests per level (default: the concurrency, at least 4).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What the requests ask: random token ids, copying or editing a passage
    /// (where speculative decoding by lookup pays), or open chat questions.
    #[arg(long, value_enum, default_value = "random")]
    pub workload: Workload,
    /// A text file the lookup workload takes its passages from (default: wllm's README).
    #[arg(long)]
    pub passages: Option<std::path::PathBuf>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Plot throughput and TTFT against concurrency as SVG.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// One request's client-side timings.
struct Sample {
    ttft: f64,
    itls: Vec<f64>,
    output_tokens: usize,
}

async fn one_request(url: String, body: Value) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    let mut r = client::post_stream(&url, &body).await?;
    if r.status != 200 {
        let status = r.status;
        bail!("server answered {status}: {}", r.text().await?);
    }
    let (mut first, mut last, mut itls, mut tokens, mut usage_tokens) = (None, None, Vec::new(), 0, None);
    while let Some(ev) = r.next_event().await? {
        if ev == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&ev).with_context(|| format!("chunk is not JSON: {ev}"))?;
        if let Some(u) = v.get("usage").and_then(|u| u["completion_tokens"].as_u64()) {
            usage_tokens = Some(u as usize);
        }
        let text = bench_workload::chunk_text(&v);
        if text.is_empty() {
            continue;
        }
        let now = t0.elapsed().as_secs_f64();
        match last {
            None => first = Some(now),
            Some(prev) => itls.push(now - prev),
        }
        last = Some(now);
        tokens += 1;
    }
    Ok(Sample {
        ttft: first.unwrap_or(t0.elapsed().as_secs_f64()),
        itls,
        output_tokens: usage_tokens.unwrap_or(tokens),
    })
}

/// Peak memory figures a wllm server reports on /metrics (absent on other servers).
async fn server_peaks(base: &str) -> (Option<f64>, Option<f64>) {
    let Ok((200, text)) = client::get(&format!("{base}/metrics")).await else {
        return (None, None);
    };
    let find = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    (
        find("wllm:gpu_memory_allocated_peak_bytes"),
        find("wllm:gpu_memory_reserved_peak_bytes"),
    )
}

/// wllm's speculative decoding counters on /metrics: drafted and accepted
/// tokens so far (absent where the server has none).
async fn spec_counters(base: &str) -> Option<(f64, f64)> {
    let Ok((200, text)) = client::get(&format!("{base}/metrics")).await else {
        return None;
    };
    let find = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((
        find("wllm:spec_decode_num_draft_tokens_total")?,
        find("wllm:spec_decode_num_accepted_tokens_total")?,
    ))
}

fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

pub fn run(a: &BenchServeArgs) -> anyhow::Result<()> {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) || a.input_len == 0 || a.output_len == 0 {
        bail!("--concurrency levels, --input-len and --output-len must be positive");
    }
    let passages = match &a.passages {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading --passages {}", p.display()))?,
        None => bench_workload::DEFAULT_PASSAGES.to_string(),
    };
    if passages.trim().is_empty() {
        bail!("--passages: the file has no text to take passages from");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if a.base_url.is_some() && a.engine.trace.is_some() {
        bail!(
            "--trace records wllm's own engine: run it without --base-url (or trace the server with `wllm serve --trace`)"
        );
    }
    let mut traced = None;
    let (base, in_process) = match &a.base_url {
        Some(u) => (u.trim_end_matches('/').trim_end_matches("/v1").to_string(), false),
        None => {
            let engine = a.engine.start_warm()?;
            traced = Some(engine.clone());
            let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
            let addr = listener.local_addr()?;
            let cfg = wllm::server::ServerConfig {
                served_model_name: a.served_model_name.clone().unwrap_or_else(|| "wllm".into()),
                max_pending_requests: 1 << 20,
                max_connections: wllm::server::listener::default_max_connections(
                    wllm::server::listener::raise_nofile_limit(),
                ),
                ..Default::default()
            };
            rt.spawn(wllm::server::serve_on(listener, engine, cfg));
            (format!("http://{addr}"), true)
        }
    };
    let model = match &a.served_model_name {
        Some(m) => m.clone(),
        None => {
            let (st, body) = rt.block_on(client::get(&format!("{base}/v1/models")))?;
            let v: Value = serde_json::from_str(&body).with_context(|| format!("/v1/models answered {st}: {body}"))?;
            v["data"][0]["id"]
                .as_str()
                .context("/v1/models lists no model")?
                .to_string()
        }
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut levels = Vec::new();
    for &c in &a.concurrency {
        let n = a.num_prompts.unwrap_or(c.max(4));
        let requests: Vec<(&str, Value)> = (0..n)
            .map(|_| bench_workload::request(a.workload, &model, a.input_len, a.output_len, &passages, &mut rng))
            .collect();
        let spec_before = rt.block_on(spec_counters(&base));
        let bar = ProgressBar::new(n as u64);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} requests, {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("concurrency {c:>3}"));
        let t0 = Instant::now();
        let samples: Vec<anyhow::Result<Sample>> = rt.block_on(async {
            let sem = Arc::new(tokio::sync::Semaphore::new(c));
            let mut tasks = Vec::new();
            for (path, body) in requests {
                let permit = sem.clone().acquire_owned().await.expect("semaphore open");
                let (url, bar) = (format!("{base}{path}"), bar.clone());
                tasks.push(tokio::spawn(async move {
                    let r = one_request(url, body).await;
                    bar.inc(1);
                    drop(permit);
                    r
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.map_err(anyhow::Error::from).and_then(|r| r));
            }
            out
        });
        let dur = t0.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let samples: Vec<Sample> = samples.into_iter().collect::<anyhow::Result<_>>()?;
        let ttfts: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
        let itls: Vec<f64> = samples.iter().flat_map(|s| s.itls.clone()).collect();
        let out_tokens: usize = samples.iter().map(|s| s.output_tokens).sum();
        let (alloc, reserved) = rt.block_on(server_peaks(&base));
        let spec_after = rt.block_on(spec_counters(&base));
        let acceptance = match (spec_before, spec_after) {
            (Some((d0, a0)), Some((d1, a1))) if d1 > d0 => Some((a1 - a0) / (d1 - d0)),
            _ => None,
        };
        let q = |v: &[f64], p: f64| percentile(v, p).unwrap_or(f64::NAN);
        levels.push(Level {
            concurrency: c,
            num_requests: n,
            duration_s: dur,
            output_tokens_per_s: out_tokens as f64 / dur,
            requests_per_s: n as f64 / dur,
            ttft_p50_s: q(&ttfts, 0.5),
            ttft_p99_s: q(&ttfts, 0.99),
            itl_p50_s: q(&itls, 0.5),
            itl_p99_s: q(&itls, 0.99),
            peak_gpu_memory_allocated_bytes: alloc,
            peak_gpu_memory_reserved_bytes: reserved,
            peak_rss_bytes: in_process.then(peak_rss).flatten(),
            spec_acceptance: acceptance,
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    print_table(a, &model, &levels);
    if let Some(p) = &a.json {
        let j = json!({"model": model, "base_url": a.base_url, "workload": a.workload, "input_len": a.input_len, "output_len": a.output_len, "seed": a.seed, "levels": levels});
        std::fs::write(p, serde_json::to_string_pretty(&j)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, super::plot::svg(&levels, &model)).with_context(|| format!("writing {}", p.display()))?;
    }
    match traced {
        Some(engine) => a.engine.write_trace(&engine),
        None => Ok(()),
    }
}

fn print_table(a: &BenchServeArgs, model: &str, levels: &[Level]) {
    println!(
        "model {model}, workload {:?}, input {} tokens, output {} tokens{}",
        a.workload,
        a.input_len,
        a.output_len,
        if a.workload == Workload::Random { "" } else { " at most" }
    );
    println!(
        "| concurrency | requests | output tok/s | req/s | TTFT p50 (s) | TTFT p99 (s) | ITL p50 (ms) | ITL p99 (ms) | peak GPU alloc / reserved (MiB) | drafts accepted |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mib = |b: Option<f64>| b.map_or("n/a".to_string(), |b| format!("{:.0}", b / 1048576.0));
    for l in levels {
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.3} | {:.3} | {:.1} | {:.1} | {} / {} | {} |",
            l.concurrency,
            l.num_requests,
            l.output_tokens_per_s,
            l.requests_per_s,
            l.ttft_p50_s,
            l.ttft_p99_s,
            l.itl_p50_s * 1e3,
            l.itl_p99_s * 1e3,
            mib(l.peak_gpu_memory_allocated_bytes),
            mib(l.peak_gpu_memory_reserved_bytes),
            l.spec_acceptance
                .map_or("n/a".to_string(), |r| format!("{:.1} %", r * 100.0))
        );
    }
}
