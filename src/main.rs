//! The `wllm` command: chat (default), generate, info, serve, bench.

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "wllm",
    version,
    about = "LLM inference on any GPU through WGSL compute shaders"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    engine: cli::EngineArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Interactive chat (the default): replies stream token by token, then a stats line.
    Chat(cli::chat::ChatArgs),
    /// Complete one or more prompts as one batch.
    Generate(cli::generate::GenerateArgs),
    /// Print the model's shape, the adapter and the KV-cache plan.
    Info(cli::info::InfoArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(cli::serve::ServeArgs),
    /// Benchmarks: `bench serve` (concurrency sweep over HTTP), `bench prefix` (prefix cache).
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        None => cli::chat::run(&cli::chat::ChatArgs {
            engine: cli.engine,
            ..Default::default()
        }),
        Some(Command::Chat(a)) => cli::chat::run(&a),
        Some(Command::Generate(a)) => cli::generate::run(&a),
        Some(Command::Info(a)) => cli::info::run(&a),
        Some(Command::Serve(a)) => cli::serve::run(&a),
        Some(Command::Bench(c)) => cli::bench::run(&c),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
