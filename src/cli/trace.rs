//! `wllm trace FILE -o report.html`: a step trace (`--trace`) as one
//! self-contained HTML page — the step timeline and the block map at any step.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args, Clone, Debug)]
pub struct TraceArgs {
    /// A trace written by --trace (Chrome Trace Event Format JSON).
    pub file: PathBuf,
    /// Where to write the report.
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
}

pub fn run(a: &TraceArgs) -> anyhow::Result<()> {
    let data = wllm::trace::report::load(&a.file)?;
    let html = wllm::trace::report::render(&data);
    std::fs::write(&a.output, html).with_context(|| format!("writing {}", a.output.display()))?;
    let n = |k: &str| data[k].as_array().map_or(0, Vec::len);
    eprintln!(
        "report: {} steps, {} requests, {} steps changing the block map → {}",
        n("steps"),
        n("requests"),
        n("map_changes"),
        a.output.display()
    );
    Ok(())
}
