//! `frugal train --device cuda`: the run on GPU 0 through the CUDA backend (`crates/cuda`),
//! with the same validated config, data and trainer as on the CPU; the report adds the bytes
//! the driver gave (`cuMemGetInfo`) next to the arena's planned and measured peak.
//!
//! Refused before any GPU work: what the backend says it does not run (`Backend::supports`:
//! several ranks, tensor parallelism, LoRA, mixture-of-experts and latent-attention models,
//! eager attention, optimizer offload), named by `engine::backend::require`; and snapshots
//! (`--save-every`, `--resume`) and `--out`. A build without the `cuda` feature, or a machine
//! without an NVIDIA driver, gets an error (exit 2) saying which.
//!
//! Example: `frugal train --device cuda --model gpt2-124m --precision bf16 --batch 16 --seq 1024`.

use super::Args;
use anyhow::bail;

/// What the CUDA command itself cannot do yet, whatever the backend runs: keep a run.
fn refuse(args: &Args) -> anyhow::Result<()> {
    if args.comm == comm::Transport::Mpi {
        bail!(
            "--device cuda with --comm mpi: a CUDA run is one process on one GPU for now (NCCL \
             is not built); drop --comm"
        );
    }
    if args.save_every.is_some() || args.resume.is_some() || args.out.is_some() {
        bail!(
            "--device cuda with --out/--save-every/--resume: saving a CUDA run is not built yet; \
             train on the CPU to keep weights"
        );
    }
    Ok(())
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    refuse(args)?;
    #[cfg(not(feature = "cuda"))]
    bail!(
        "--device cuda needs the CUDA backend in this binary: cargo build --release -p frugal \
         --features cuda (it builds with no CUDA installed)"
    );
    #[cfg(feature = "cuda")]
    gpu::run(args)
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::super::{report, setup, Args};
    use anyhow::Context;
    use serde_json::json;

    /// A line per step on stderr (none with `--json`).
    struct Lines {
        quiet: bool,
    }

    impl train::run::Hooks<cuda::Cuda> for Lines {
        type Error = anyhow::Error;

        fn progress(
            &mut self,
            trainer: &train::Trainer<cuda::Cuda>,
            stats: &train::StepStats,
            ran: &train::run::Ran,
        ) {
            if !self.quiet {
                eprintln!(
                    "step {} | loss {:.4} | {:.0} tok/s",
                    trainer.step,
                    stats.loss,
                    ran.tokens as f64 / ran.seconds
                );
            }
        }
    }

    pub fn run(args: &Args) -> anyhow::Result<()> {
        let shared = setup::prepare(args, true)?;
        // What the run needs of the backend (LoRA, MoE, several ranks, ...), refused by name
        // before any GPU work: the backend's own answer, no device needed.
        engine::backend::require::<cuda::Cuda>(shared.config.needs())?;
        cuda::available().context("--device cuda")?;
        let (b, t) = (args.batch as usize, args.seq as usize);
        let mut loader = shared.dataset.train_loader(data::LoaderConfig::shuffled(
            data::BatchShape::single(b, t),
            args.seed,
        ))?;
        let val = shared.dataset.val_batches(data::BatchShape::single(b, t))?;
        let gpu = cuda::Cuda::new(0)?;
        let (device, context_bytes) = (gpu.describe(), gpu.context_bytes);
        let mut config = shared.config.clone();
        // The slab lives on the GPU: it is checked against the GPU's free bytes (or a smaller
        // --device-memory), not host RAM (which holds nothing of a CUDA run but the data).
        let free = gpu.capacity_bytes();
        config.device_memory_bytes = Some(config.device_memory_bytes.map_or(free, |d| d.min(free)));
        config.host_memory = None;
        let mut trainer = train::Trainer::on(gpu, config, Box::new(comm::Solo::new()))?;
        trainer.init_weights(args.seed);
        if let Some(path) = &shared.weights {
            trainer
                .load_whole(|units| models::saved::read_units(path, units))
                .with_context(|| format!("--model {}", path.display()))?;
        }
        // The same loop as on the CPU; progress as plain lines (one per step).
        let schedule = train::run::Schedule {
            steps: args.steps,
            val_every: args.val_every,
            val_batches: args.val_batches,
        };
        let mut hooks = Lines { quiet: args.json };
        let ran = train::run::run(&mut trainer, &mut loader, &val, &schedule, &mut hooks)?;
        let memory = vec![trainer.memory()];
        report::check_planned_equals_measured(&memory[0])?;
        let driver_bytes = trainer.arena.backend().device_bytes_in_use()?;
        let summary = report::Summary {
            trainer: &trainer,
            memory: &memory,
            ran: &ran,
            sample: None,
        };
        if args.json {
            let mut out = report::json_value(&summary);
            out["device"] = json!(device);
            out["backend_scratch_bytes"] = json!(plan_frugal::device::SCRATCH_BYTES);
            out["driver_bytes"] = json!(driver_bytes);
            out["context_bytes"] = json!(context_bytes);
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            print!("{}", report::human(&summary, args));
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            println!(
                "{device}: the driver gave {:.3} GiB (arena slab + backend scratch), context \
                 {:.3} GiB",
                gib(driver_bytes),
                gib(context_bytes)
            );
        }
        Ok(())
    }
}
