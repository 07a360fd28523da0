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
    /// Embed texts (mean, cls or last pooling; unit length) and print their cosine similarities.
    Embed(cli::embed::EmbedArgs),
    /// Print the model's shape, the adapter and the KV-cache plan.
    Info(cli::info::InfoArgs),
    /// Write every rendered WGSL kernel variant to a directory (`--dump DIR`).
    Kernels(cli::kernels::KernelsArgs),
    /// Where a step's milliseconds go: per-kernel times of decode steps and a prefill chunk.
    Profile(cli::profile::ProfileArgs),
    /// Perplexity of a text file, as llama.cpp's llama-perplexity measures it.
    Perplexity(cli::perplexity::PerplexityArgs),
    /// Re-quantise a GGUF at one of llama.cpp's mixes: `wllm quantize IN OUT Q4_K_M`.
    Quantize(cli::quantize::QuantizeArgs),
    /// Serve the OpenAI-compatible HTTP API (with a chat page at / and a live engine page at /engine).
    Serve(cli::serve::ServeArgs),
    /// Turn a step trace (--trace FILE) into a self-contained HTML report: `wllm trace FILE -o report.html`.
    Trace(cli::trace::TraceArgs),
    /// Benchmarks: `bench serve` (concurrency sweep over HTTP), `bench prefix` (prefix cache).
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
}

/// Vulkan's window-system layer (libwayland, loaded by the driver even though
/// wllm opens no window) prints "error: XDG_RUNTIME_DIR is invalid or not set"
/// when the variable is missing or points nowhere, as in containers and CI. That
/// is not an error of ours, so give it a private runtime directory (0700, as the
/// XDG spec asks) before anything opens a device.
fn ensure_runtime_dir() {
    let ok = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
    if ok || !cfg!(unix) {
        return;
    }
    // One directory per user (the owner of /proc/self), reused across runs.
    #[cfg(unix)]
    let who = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map_or(std::process::id(), |m| m.uid())
    };
    #[cfg(not(unix))]
    let who = std::process::id();
    let dir = std::env::temp_dir().join(format!("wllm-runtime-{who}"));
    let made = std::fs::create_dir_all(&dir).is_ok();
    #[cfg(unix)]
    let made = made && {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_ok()
    };
    if made {
        // SAFETY: called first thing in `main`, before any thread exists (clap
        // parsing spawns none), so no other thread can read the environment
        // while it is written.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
    }
}

fn main() {
    ensure_runtime_dir();
    // SAFETY: first thing in `main`, before any thread exists (as above).
    unsafe { wllm::gpu::default_llvmpipe_threads() };
    let cli = Cli::parse();
    let result = match cli.command {
        None => cli::chat::run(&cli::chat::ChatArgs {
            engine: cli.engine,
            ..Default::default()
        }),
        Some(Command::Chat(a)) => cli::chat::run(&a),
        Some(Command::Generate(a)) => cli::generate::run(&a),
        Some(Command::Embed(a)) => cli::embed::run(&a),
        Some(Command::Info(a)) => cli::info::run(&a),
        Some(Command::Kernels(a)) => cli::kernels::run(&a),
        Some(Command::Profile(a)) => cli::profile::run(&a),
        Some(Command::Perplexity(a)) => cli::perplexity::run(&a),
        Some(Command::Quantize(a)) => cli::quantize::run(&a),
        Some(Command::Serve(a)) => cli::serve::run(&a),
        Some(Command::Trace(a)) => cli::trace::run(&a),
        Some(Command::Bench(c)) => cli::bench::run(&c),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
