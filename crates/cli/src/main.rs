//! The `frugal` binary: the only crate that prints.
//!
//! Each subcommand lives in its own `cmd_*.rs` module with a clap `Args` struct and a
//! `run(args) -> anyhow::Result<()>`. Numerics stay in the library crates; this crate turns
//! their results into tables, JSON, plots and progress bars.
//!
//! Example: `frugal plan --model llama3-8b --train --zero 3 --gpus 8 --json`.

mod cmd_export;
mod cmd_fit;
mod cmd_formats;
mod cmd_generate;
mod cmd_perplexity;
mod cmd_plan;
mod cmd_serve;
mod cmd_tokenize;
mod cmd_train;
mod cmd_web;
mod workers;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// frugal: train transformer language models in less memory, and know before anything runs how
/// much memory a training or inference setup needs.
#[derive(Parser)]
#[command(
    name = "frugal",
    version,
    about,
    long_about = None,
    arg_required_else_help = true,
    after_help = "Environment:\n  FRUGAL_ISA=portable|avx2|avx2vnni|avx512|avx512vnni|avx512bf16|amx   cap every kernel at \
this instruction-set level (default: the best this CPU runs), e.g. to time or test the AVX2 paths \
on an AVX-512 machine (avx2vnni, avx512vnni: with VNNI's integer dot products); a level the CPU lacks is \
refused. `frugal bench train --json` lists the path each kernel took."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Number formats (fp32, fp16, bf16, fp8, int8, int4, nf4): bit layouts, ranges, quantization.
    Formats(cmd_formats::Args),
    /// Memory plan of a training or inference setup, per device, before anything runs.
    #[command(long_about = cmd_plan::LONG_ABOUT)]
    Plan(cmd_plan::Args),
    /// Search the setups that fit a device's memory and rank them by predicted step time.
    Fit(cmd_fit::Args),
    /// Train a GPT-2, Llama, Qwen2, Mistral, Mixtral or DeepSeek-V2 model on CPU ranks, with memory
    /// measured against the plan.
    Train(cmd_train::Args),
    /// Benchmarks: speed and memory against a baseline measured in the same run.
    Bench(bench::Args),
    /// Export a training snapshot as a Hugging Face model folder (config.json + model.safetensors).
    Export(cmd_export::Args),
    /// Generate text with the inference engine: KV cache, quantized weights and KV, speculative
    /// decoding.
    Generate(cmd_generate::Args),
    /// The planner in a browser: a page and a JSON API (the CLI's JSON) on this machine.
    Web(cmd_web::Args),
    /// Serve a model behind the OpenAI API (completions, chat, streaming) on this machine.
    Serve(cmd_serve::Args),
    /// Perplexity of a model on a text, computed as llama.cpp's llama-perplexity computes it.
    Perplexity(cmd_perplexity::Args),
    /// Token ids of texts under a model's own tokenizer (or the text of ids).
    Tokenize(cmd_tokenize::Args),
}

/// The environment variable that caps every kernel's instruction set (`kernels::cpu`): read
/// here, once, and passed down.
const ISA_VAR: &str = "FRUGAL_ISA";

/// Applies `FRUGAL_ISA` (unset or empty: the CPU's best); a name that is not a level, or a level
/// this CPU does not run (above it, or `avx2vnni` without AVX-VNNI), is refused before any work.
fn cap_instruction_set() -> Result<(), String> {
    let value = match std::env::var(ISA_VAR) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => return Ok(()),
    };
    let level = kernels::cpu::parse(&value).map_err(|e| format!("{ISA_VAR}: {e}"))?;
    kernels::cpu::set_cap(level).map_err(|e| format!("{ISA_VAR}={value}: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = cap_instruction_set() {
        eprintln!("error: {err}");
        return ExitCode::from(2);
    }
    silence_overflow_panics();
    models::on_warning(|w| eprintln!("warning: {w}"));
    // The servers run their own threads (serve's engine on a pool of its own); every other
    // command computes on a pool it drives from one of its workers.
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Web(args) => cmd_web::run(args),
        Command::Serve(args) => cmd_serve::run(args),
        command => workers::install(|| match command {
            Command::Formats(args) => cmd_formats::run(args),
            Command::Plan(args) => cmd_plan::run(args),
            Command::Fit(args) => cmd_fit::run(args),
            Command::Train(args) => cmd_train::run(args),
            Command::Bench(args) => bench::run(args),
            Command::Export(args) => cmd_export::run(args),
            Command::Generate(args) => cmd_generate::run(args),
            Command::Tokenize(args) => cmd_tokenize::run(args),
            Command::Perplexity(args) => cmd_perplexity::run(args),
            Command::Web(_) | Command::Serve(_) => unreachable!("matched above"),
        }),
    });
    let result = match result {
        Ok(result) => result,
        Err(payload) if overflow_message(&*payload).is_some() => Err(overflowed(&*payload)),
        // The reader of our output went away (`frugal plan --json | head`): stop quietly, as
        // a tool killed by SIGPIPE does.
        Err(payload) if closed_pipe(&*payload) => return ExitCode::from(141),
        Err(payload) => std::panic::resume_unwind(payload),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// The planner's arithmetic is overflow-checked in every profile (Cargo.toml): such a panic
/// means the inputs are too large for 64-bit byte counts, which `main` reports as an error; a
/// write to a closed pipe ends the run quietly; every other panic is a bug and prints as usual.
fn silence_overflow_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let expected = overflow_message(info.payload()).is_some() || closed_pipe(info.payload());
        if !expected {
            default(info);
        }
    }));
}

/// Whether a panic is `println!`'s on a closed pipe (the standard library ignores SIGPIPE, so
/// a write to a pipe whose reader left fails, and `println!` panics on it).
fn closed_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    text.is_some_and(|t| t.starts_with("failed printing to") && t.contains("Broken pipe"))
}

fn overflow_message(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))?;
    text.contains("with overflow").then_some(text)
}

/// The error for an overflowed byte count, naming the inputs (this command line).
fn overflowed(payload: &(dyn std::any::Any + Send)) -> anyhow::Error {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::anyhow!(
        "the sizes asked for overflow 64-bit byte counts ({}): `frugal {}` describes more than \
         2^64 bytes; use a smaller --batch, --seq or model",
        overflow_message(payload).unwrap_or("overflow"),
        args.join(" ")
    )
}
