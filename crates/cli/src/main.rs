//! The `frugal` binary: the only crate that prints.
//!
//! Each subcommand lives in its own `cmd_*.rs` module with a clap `Args` struct and a
//! `run(args) -> anyhow::Result<()>`. Numerics stay in the library crates; this crate turns
//! their results into tables, JSON, plots and progress bars.
//!
//! Example: `frugal plan --model llama3-8b --train --zero 3 --gpus 8 --json`.

mod cmd_bench;
mod cmd_export;
mod cmd_fit;
mod cmd_formats;
mod cmd_plan;
mod cmd_train;
mod output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// frugal: train transformer language models in less memory, and know before anything runs how
/// much memory a training or inference setup needs.
#[derive(Parser)]
#[command(name = "frugal", version, about, long_about = None, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(
        about = "Number formats (fp32, fp16, bf16, fp8, int8, int4, nf4): bit layouts, ranges, quantization."
    )]
    Formats(cmd_formats::Args),
    #[command(
        about = "Memory plan of a training or inference setup, per device, before anything runs."
    )]
    Plan(cmd_plan::Args),
    #[command(
        about = "Search the setups that fit a device's memory and rank them by predicted step time."
    )]
    Fit(cmd_fit::Args),
    #[command(
        about = "Train a GPT-2 or Llama-style model on CPU ranks, with memory measured against the plan."
    )]
    Train(cmd_train::Args),
    #[command(about = "Benchmarks: speed and memory against a baseline measured in the same run.")]
    Bench(cmd_bench::Args),
    #[command(
        about = "Export a training snapshot as a Hugging Face model folder (config.json + model.safetensors)."
    )]
    Export(cmd_export::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Formats(args) => cmd_formats::run(args),
        Command::Plan(args) => cmd_plan::run(args),
        Command::Fit(args) => cmd_fit::run(args),
        Command::Train(args) => cmd_train::run(args),
        Command::Bench(args) => cmd_bench::run(args),
        Command::Export(args) => cmd_export::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
