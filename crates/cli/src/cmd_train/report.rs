//! What `frugal train` shows after a run: planned vs measured memory per category (they must be
//! equal), the loss curve's ends, throughput, the sample; the `--json` object of docs/cli.md's CLI
//! contract; and the `--plot` SVG of train and validation loss.
//!
//! Example: `report::json(&summary)` is `{"steps":300,"tokens":...,"ranks":[{"rank":0,...}]}`.

use super::Args;
use anyhow::{bail, Context};
use engine::backend::TrainOps;
use plan::buffer::{Category, Device};
use serde_json::{json, Map, Value};
use std::path::Path;
use term::{human_bytes, Table};
use train::run::{Curves, Ran};
use train::Trainer;
use train::{MemoryBreakdown, RankMemory};

pub struct Summary<'a, B: TrainOps = cpu::Cpu> {
    /// Rank 0's trainer.
    pub trainer: &'a Trainer<B>,
    /// Every rank's planned and measured bytes, rank 0 first (gathered over the communicator).
    pub memory: &'a [RankMemory],
    /// The loss curves, tokens and seconds of the steps.
    pub ran: &'a Ran,
    pub sample: Option<&'a str>,
}

/// `(planned, measured)` per-device byte counts of one rank, in the JSON contract's fields. The
/// categories are the breakdown at the peak (they sum to peak_bytes), as `frugal plan` prints them.
fn per_device(rank: &RankMemory) -> (Map<String, Value>, Map<String, Value>) {
    let fill = |m: &MemoryBreakdown| {
        let mut obj = Map::new();
        for c in Category::ALL {
            obj.insert(c.json_field().into(), json!(m.at_peak_bytes[c as usize]));
        }
        obj.insert("peak_bytes".into(), json!(m.peak_bytes));
        obj.insert("reserved_bytes".into(), json!(m.reserved_bytes));
        obj.insert("context_bytes".into(), json!(0));
        obj.insert("total_bytes".into(), json!(m.reserved_bytes));
        obj
    };
    (fill(&rank.planned), fill(&rank.measured))
}

/// ZeRO's claim on one rank: persistent model state (weights, gradients, optimizer state) against
/// 16Ψ/N (fp32 AdamW: 4 + 4 + 8 bytes per parameter, Ψ the padded parameter count), and the
/// gathered working set (stage 3's gathered units, at the step's peak).
pub struct ModelState {
    pub stage: u8,
    /// Data-parallel ranks (ZeRO's N) and the tensor-parallel degree.
    pub ranks: u64,
    pub tp: u32,
    pub pp: u32,
    pub psi: u64,
    pub state_bytes: u64,
    pub sixteen_psi_over_n_bytes: u64,
    pub gathered_at_peak_bytes: u64,
    /// Bytes rank 0 sent in its last optimizer step (ring model).
    pub comm_bytes_per_step: u64,
    /// Seconds rank 0 spent blocked in its data-parallel collectives over the run, and whether
    /// they ran on their own thread (`--overlap-comm`, ZeRO-3).
    pub comm_blocked_s: f64,
    pub overlap_comm: bool,
}

pub fn model_state<B: TrainOps>(t: &Trainer<B>) -> ModelState {
    use plan::buffer::Lifetime;
    let psi: u64 = t.model.units.iter().map(|u| u.padded_numel).sum();
    let ranks = t.sharding.world as u64;
    let state_bytes = t.plan.model_state_bytes();
    let (peak_phase, _) = t.plan.at_peak(Device::Gpu);
    let n_layers = t.plan.n_layers;
    let at = peak_phase.ordinal(n_layers);
    let gathered_at_peak_bytes = t
        .plan
        .buffers
        .iter()
        .filter(|b| b.name.starts_with("gather."))
        .filter(|b| match b.lifetime {
            Lifetime::Span { born, dies } => {
                born.ordinal(n_layers) <= at && at <= dies.ordinal(n_layers)
            }
            Lifetime::Persistent => true,
        })
        .map(|b| b.bytes)
        .sum();
    ModelState {
        stage: t.sharding.stage() as u8,
        ranks,
        tp: t.config.tp.max(1),
        pp: t.config.pp.max(1),
        psi,
        state_bytes,
        sixteen_psi_over_n_bytes: 16 * psi / ranks,
        gathered_at_peak_bytes,
        comm_bytes_per_step: t.last_step_comm.total_sent_bytes(),
        comm_blocked_s: t.comm_blocked().as_secs_f64(),
        overlap_comm: t.comm_overlapped(),
    }
}

/// Fails the run if a rank's measured bytes differ from its plan's in any field.
pub fn check_planned_equals_measured(rank: &RankMemory) -> anyhow::Result<()> {
    let (planned, measured) = per_device(rank);
    for (field, p) in &planned {
        if measured.get(field) != Some(p) {
            bail!(
                "internal error: rank {}'s measured {field} {} differs from the plan's {p}",
                rank.rank,
                measured[field]
            );
        }
    }
    Ok(())
}

fn first_last(points: &[(u64, f32)]) -> (f32, f32) {
    let first = points.first().map_or(f32::NAN, |p| p.1);
    let last = points.last().map_or(f32::NAN, |p| p.1);
    (first, last)
}

/// The `--json` object as a value (a driver may add its own fields).
pub fn json_value<B: TrainOps>(s: &Summary<'_, B>) -> Value {
    let ranks: Vec<Value> = s
        .memory
        .iter()
        .map(|r| {
            let (planned, measured) = per_device(r);
            json!({"rank": r.rank, "planned": planned, "measured": measured,
                   "process_peak_rss_bytes": r.process_peak_rss_bytes})
        })
        .collect();
    let (loss_first, loss_last) = first_last(&s.ran.curves.train);
    let val_loss = s.ran.curves.val.last().map(|p| p.1);
    json!({
        "model": s.trainer.config.model.shape.name,
        "steps": s.ran.curves.train.len(),
        "tokens": s.ran.tokens,
        "loss_first": loss_first,
        "loss_last": loss_last,
        "val_loss": val_loss,
        "val_step": s.ran.curves.val.last().map(|p| p.0),
        "val_curve": s.ran.curves.val,
        "seconds": s.ran.seconds,
        "tokens_per_s": s.ran.tokens as f64 / s.ran.seconds,
        "ranks": ranks,
        "zero": zero_json(&model_state(s.trainer)),
        "precision": super::precision::json(s.trainer),
        "offload": super::precision::offload_json(s.trainer),
        "sample": s.sample,
    })
}

/// The `--json` object of a run.
pub fn json<B: TrainOps>(s: &Summary<'_, B>) -> String {
    serde_json::to_string_pretty(&json_value(s)).expect("a JSON value serialises")
}

fn zero_json(m: &ModelState) -> Value {
    json!({
        "stage": m.stage,
        "ranks": m.ranks,
        "params_padded": m.psi,
        "model_state_bytes": m.state_bytes,
        "sixteen_psi_over_n_bytes": m.sixteen_psi_over_n_bytes,
        "gathered_at_peak_bytes": m.gathered_at_peak_bytes,
        "comm_sent_bytes_per_step": m.comm_bytes_per_step,
        "comm_blocked_s": m.comm_blocked_s,
        "overlap_comm": m.overlap_comm,
    })
}

/// The lines under the memory table that show ZeRO's claim.
fn zero_lines(m: &ModelState) -> String {
    let share = match (m.tp, m.pp) {
        (1, 1) => String::new(),
        (tp, 1) => format!(" of its 1/{tp} tensor-parallel share"),
        (1, _) => " of its pipeline stage".to_string(),
        (tp, _) => format!(" of its 1/{tp} tensor-parallel share of its pipeline stage"),
    };
    let mut out = format!(
        "ZeRO stage {} on {}: model state per rank{share} {} (params + grads + optimizer) \
         vs 16Ψ/N = {} (Ψ = {} parameters, padded)\n",
        m.stage,
        term::plural(m.ranks, "data-parallel rank"),
        human_bytes(m.state_bytes),
        human_bytes(m.sixteen_psi_over_n_bytes),
        m.psi
    );
    if m.stage == 3 {
        out.push_str(&format!(
            "plus the gathered working set at the peak: {} (in other)\n",
            human_bytes(m.gathered_at_peak_bytes)
        ));
    }
    if m.ranks > 1 {
        // The ZeRO paper's volumes, with the ring's (N-1)/N factor: 2Ψ for stages 0-2, 3Ψ for 3.
        let volumes = if m.stage == 3 { 3.0 } else { 2.0 };
        let n = m.ranks as f64;
        let paper = volumes * (4 * m.psi) as f64 * (n - 1.0) / n;
        out.push_str(&format!(
            "communication in the last step (rank 0, ring model): {} = {:.3} x the paper's \
             {}Ψ(N-1)/N ({})\n",
            human_bytes(m.comm_bytes_per_step),
            m.comm_bytes_per_step as f64 / paper,
            volumes,
            human_bytes(paper as u64)
        ));
    }
    out
}

pub fn human<B: TrainOps>(s: &Summary<'_, B>, args: &Args) -> String {
    let t = s.trainer;
    let shape = &t.config.model.shape;
    let (planned, measured) = per_device(&s.memory[0]);
    let mut table = Table::new(&["memory (rank 0)", "planned", "measured", "bytes"]);
    let fields = Category::ALL
        .iter()
        .map(|c| c.json_field())
        .chain(["peak_bytes", "reserved_bytes"]);
    for field in fields {
        let (p, m) = (
            planned[field].as_u64().unwrap_or(0),
            measured[field].as_u64().unwrap_or(0),
        );
        let name = field.trim_end_matches("_bytes").replace('_', " ");
        table.row(vec![name, human_bytes(p), human_bytes(m), m.to_string()]);
    }
    let (first, last) = first_last(&s.ran.curves.train);
    let val = s.ran.curves.val.last().map_or(f32::NAN, |p| p.1);
    // A validation stopped by a signal leaves an earlier step's loss as the last one.
    let val_step = s.ran.curves.val.last().map(|p| p.0);
    let last_step = s.ran.curves.train.last().map(|p| p.0);
    let val_at = match (val_step, last_step) {
        (Some(v), Some(t)) if v < t => format!(" (at step {v})"),
        _ => String::new(),
    };
    let mut out = format!(
        "trained {} ({} layers, d_model {}, vocab {}) for {} of {} x {} tokens (x{} accumulation, {})\n",
        shape.name,
        shape.n_layers,
        shape.d_model,
        shape.vocab,
        term::plural(s.ran.curves.train.len() as u64, "step"),
        args.batch,
        args.seq,
        args.grad_accum,
        match (args.tp, args.pp) {
            (1, 1) => term::plural(s.memory.len() as u64, "rank"),
            (tp, pp) => format!(
                "{} ranks: tp {tp} x pp {pp} x dp {}",
                s.memory.len(),
                s.memory.len() as u32 / (tp * pp)
            ),
        }
    );
    out.push_str(&format!(
        "loss {first:.3} -> {last:.3}, validation loss {val:.3}{val_at}; {:.0} tokens/s over {:.1} s\n\n",
        s.ran.tokens as f64 / s.ran.seconds,
        s.ran.seconds
    ));
    let (phase, _) = t.plan.at_peak(Device::Gpu);
    out.push_str(&format!(
        "memory at the step's peak ({}): planned vs measured (MiB = 2^20 bytes)\n",
        fit::report::phase_name(phase)
    ));
    out.push_str(&table.render());
    if s.memory.len() > 1 {
        out.push_str(&format!(
            "(each of the {} ranks measured exactly its plan)\n",
            s.memory.len()
        ));
    }
    if args.tp > 1 || args.pp > 1 {
        // Ranks differ: a pipeline stage holds its layers, a tensor-parallel rank its slice.
        let (tp, dp) = (
            args.tp.max(1) as usize,
            s.memory.len() / (args.tp * args.pp) as usize,
        );
        for r in s.memory {
            out.push_str(&format!(
                "  rank {} (stage {}, tp rank {}): peak {} planned and measured\n",
                r.rank,
                r.rank / (tp * dp.max(1)),
                r.rank % tp,
                human_bytes(r.measured.peak_bytes)
            ));
        }
    }
    let rss: Vec<String> = s
        .memory
        .iter()
        .map(|r| human_bytes(r.process_peak_rss_bytes))
        .collect();
    let processes = match args.comm {
        comm::Transport::Mpi => format!("per process (rank order): {}", rss.join(", ")),
        comm::Transport::Threads => format!("of this process: {}", rss[0]),
    };
    out.push_str(&format!("peak resident memory (VmHWM) {processes}\n"));
    out.push_str(&zero_lines(&model_state(t)));
    out.push_str(&super::precision::line(t));
    out.push_str(&super::precision::offload_line(t));
    if let Some(sample) = s.sample {
        out.push_str(&format!("\nsample:\n{sample}\n"));
    }
    if let Some(dir) = &args.out {
        let saved = match (&t.model.lora, args.merge) {
            (Some(_), false) => "PEFT adapters (adapter_model.safetensors, adapter_config.json)",
            (Some(_), true) => "PEFT adapters and the merged model (merged/)",
            (None, _) => "model.safetensors and config.json",
        };
        out.push_str(&format!("\nsaved {saved} to {}\n", dir.display()));
    }
    if let Some(lora) = &t.model.lora {
        let trained: u64 = t.model.units.iter().map(|u| u.numel).sum();
        out.push_str(&format!(
            "LoRA r {} (alpha {}) on {} over a frozen {} base: {trained} trained parameters\n",
            lora.setup.rank,
            lora.alpha,
            lora.setup.targets.join(","),
            lora.format.name()
        ));
    }
    out
}

/// Train and validation loss against the step, as SVG.
pub fn plot(path: &Path, curves: &Curves) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let all = curves.train.iter().chain(&curves.val).map(|p| p.1);
    let (lo, hi) = all.fold((f32::MAX, f32::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let steps = curves.train.last().map_or(1, |p| p.0).max(1);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("frugal train: loss", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0u64..steps, (lo * 0.95)..(hi * 1.05))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .draw()?;
        chart
            .draw_series(LineSeries::new(curves.train.iter().copied(), &BLUE))?
            .label("train")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(curves.val.iter().copied(), &RED))?
            .label("validation")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("writing the plot {}", path.display()))
}
