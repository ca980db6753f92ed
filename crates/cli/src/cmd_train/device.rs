//! `frugal train --device NAME` for a backend on a device of its own (`engine::backend::
//! Accelerator`; the CUDA one, `crates/cuda`, on GPU 0), with the same validated config, data,
//! trainer and loop as on the CPU; the report adds the bytes the driver gave next to the arena's
//! planned and measured peak, which must be equal as on the CPU.
//!
//! Refused before any device work: what the backend says it does not run (`Backend::supports`:
//! several ranks, tensor parallelism, LoRA, ...), named by `engine::backend::require`; and
//! snapshots (`--save-every`, `--resume`) and `--out`. A build without the backend's feature, or
//! a machine without its driver, gets an error (exit 2) saying which.
//!
//! Example: `frugal train --device cuda --model gpt2-124m --precision bf16 --batch 16 --seq 1024`.

use super::{report, setup, Args};
use anyhow::{bail, Context};
use engine::backend::Accelerator;
use serde_json::json;

/// What a run on a device does not do, whatever its backend runs: keep a run, MPI ranks.
fn refuse(args: &Args) -> anyhow::Result<()> {
    let device = args.device.name();
    if args.comm == comm::Transport::Mpi {
        bail!(
            "--device {device} with --comm mpi: a {device} run is one process on one device; \
             drop --comm"
        );
    }
    if args.save_every.is_some() || args.resume.is_some() || args.out.is_some() {
        bail!(
            "--device {device} with --out/--save-every/--resume: a {device} run keeps no \
             weights or snapshots; train on the CPU to keep them"
        );
    }
    Ok(())
}

/// The answer of a binary built without the device's backend, after [`refuse`]'s.
#[allow(dead_code)] // every device's backend may be built in
pub fn not_built(args: &Args) -> anyhow::Result<()> {
    refuse(args)?;
    let device = args.device.name();
    bail!(
        "--device {device} needs its backend in this binary: cargo build --release -p frugal \
         --features {device}"
    )
}

/// A line per step on stderr (none with `--json`).
struct Lines {
    quiet: bool,
}

impl<B: Accelerator> train::run::Hooks<B> for Lines {
    type Error = anyhow::Error;

    fn progress(
        &mut self,
        trainer: &train::Trainer<B>,
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

/// The run on device 0 of backend `B`.
#[allow(dead_code)] // a build without any device backend calls only `not_built`
pub fn run<B: Accelerator>(args: &Args) -> anyhow::Result<()> {
    refuse(args)?;
    let name = format!("--device {}", args.device.name());
    let shared = setup::prepare(args, true)?;
    // What the run needs of the backend (LoRA, MoE, several ranks, ...), refused by name
    // before any device work: the backend's own answer, no device needed.
    engine::backend::require::<B>(shared.config.needs())?;
    let gpu = B::open(0).context(name.clone())?;
    let (b, t) = (args.batch as usize, args.seq as usize);
    let mut loader = shared.dataset.train_loader(data::LoaderConfig::shuffled(
        data::BatchShape::single(b, t),
        args.seed,
    ))?;
    let val = shared.dataset.val_batches(data::BatchShape::single(b, t))?;
    let (device, context_bytes) = (gpu.describe(), gpu.context_bytes());
    let mut config = shared.config.clone();
    // The slab lives on the device: it is checked against the device's free bytes (or a
    // smaller --device-memory), not host RAM (which holds nothing of the run but the data).
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
    let driver_bytes = trainer.arena.backend().bytes_in_use().context(name)?;
    let summary = report::Summary {
        trainer: &trainer,
        memory: &memory,
        ran: &ran,
        sample: None,
    };
    if args.json {
        let mut out = report::json_value(&summary);
        out["device"] = json!(device);
        out["backend_scratch_bytes"] = json!(B::SCRATCH_BYTES);
        out["driver_bytes"] = json!(driver_bytes);
        out["context_bytes"] = json!(context_bytes);
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report::human(&summary, args));
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "{device}: the driver gave {:.3} GiB (arena slab + backend scratch), context {:.3} \
             GiB",
            gib(driver_bytes),
            gib(context_bytes)
        );
    }
    Ok(())
}
