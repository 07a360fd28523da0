//! `wllm bench`: serving and prefix-cache benchmarks.

use clap::Subcommand;

#[derive(Subcommand, Clone, Debug)]
pub enum BenchCommand {
    /// Throughput, TTFT, ITL and peak memory at rising concurrency, over HTTP.
    Serve(super::bench_serve::BenchServeArgs),
    /// Prefill time, TTFT and hit rate with and without prefix-cache hits.
    Prefix(super::bench_prefix::BenchPrefixArgs),
    /// A mixed load for a while (disconnects, bad requests, n > 1, …), then leaks, RSS and ITL p99.
    Soak(super::bench_soak::BenchSoakArgs),
}

pub fn run(c: &BenchCommand) -> anyhow::Result<()> {
    match c {
        BenchCommand::Serve(a) => super::bench_serve::run(a),
        BenchCommand::Prefix(a) => super::bench_prefix::run(a),
        BenchCommand::Soak(a) => super::bench_soak::run(a),
    }
}
