//! The `pytorch` runtime profile: what PyTorch 2.x with HF transformers allocates on one CUDA
//! device for a training step or for inference (prefill and decode).
//!
//! It replays HF's forward op by op on a tape ([`tape`]): which tensors each op allocates, in which
//! dtype, which ones autograd saves for backward, and when Python lets go of the rest; then the
//! backward pass, the optimizer step, and PyTorch's caching allocator ([`allocator`]) for the
//! reserve. Nothing here is fitted to measurements: the only measured constants are the CUDA
//! context and the cuBLAS workspace sizes. Checked against `tests/data/pytorch_h200.jsonl`
//! (`tests/calibration.rs`). Also LoRA/QLoRA as PEFT and bitsandbytes run them ([`peft`]), and
//! HF 5's MoE (grouped_mm experts) and MLA blocks ([`moe`]). Not modelled (typed `Unsupported`
//! errors): see the `unsupported` call sites.
//! Example: `pytorch::training_estimate(&shape, &setup)?.peak_bytes`.

pub mod allocator;
pub mod blocks;
pub mod infer;
pub mod layers;
pub mod model;
pub mod moe;
pub mod peft;
pub mod tape;
pub mod train;
pub mod zero;

use plan::buffer::{Buffer, Lifetime};
use plan::{
    Category, Device, Estimate, InferSetup, MemoryPlan, ModelShape, Phase, PlanError, TrainSetup,
};
use tape::{Event, Tape};

pub const RUNTIME: &str = "pytorch";
const MIB: u64 = 1 << 20;

/// cuBLAS workspace per (handle, stream) on sm90 (`CUBLAS_WORKSPACE_CONFIG` default :4096:8,
/// allocated through the caching allocator), plus cuBLASLt's 1 MiB.
pub const CUBLAS_WORKSPACE_BYTES: u64 = 32 * MIB + MIB;

pub(crate) fn unsupported(what: &str) -> PlanError {
    PlanError::Unsupported {
        runtime: RUNTIME,
        what: what.to_string(),
    }
}

pub use plan::runtime::cuda_context_bytes as context_bytes;

/// Which torch AdamW implementation runs the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerImpl {
    /// `fused=True`: one kernel, no temporaries.
    Fused,
    /// `foreach=True` (the default without `fused`): list ops with a temporary per parameter.
    Foreach,
}

/// A training estimate with the numbers `shared/calibration` records.
#[derive(Clone, Debug)]
pub struct TrainDetail {
    pub estimate: Estimate,
    /// Weights plus optimizer state between steps.
    pub steady_bytes: u64,
    /// Live bytes after the forward and the forward's peak, workspaces included like `peak_bytes`.
    pub after_forward_bytes: u64,
    pub forward_peak_bytes: u64,
    /// cuBLAS workspaces inside `peak_bytes` (forward thread and autograd's backward thread).
    pub workspace_bytes: u64,
}

/// The `pytorch` estimate of one training step (fused AdamW).
pub fn training_estimate(model: &ModelShape, setup: &TrainSetup) -> Result<Estimate, PlanError> {
    Ok(training_detail(model, setup, OptimizerImpl::Fused)?.estimate)
}

pub fn training_detail(
    model: &ModelShape,
    setup: &TrainSetup,
    opt: OptimizerImpl,
) -> Result<TrainDetail, PlanError> {
    let sim = train::simulate_step(model, setup, opt)?;
    let workspace_bytes = 2 * CUBLAS_WORKSPACE_BYTES;
    let mut a = allocator::Allocator::default();
    let reserved = a.replay_run(&sim.tape, &sim.order) + 2 * (32 * MIB + 2 * MIB);
    let mut plan = to_plan(&sim.tape, model.n_layers);
    plan.push(workspace_buffer(workspace_bytes));
    let phases = plan::Phase::training_timeline(model.n_layers);
    let mut phase_peaks = sim.tape.phase_peaks(&phases, model.n_layers);
    for (_, c) in &mut phase_peaks {
        c[Category::Other as usize] += workspace_bytes;
    }
    if sim.host_bytes > 0 {
        // DeepSpeed's CPU offload keeps master weights, moments and the fp32 gradient partition
        // in pinned host memory for the whole run.
        plan.push(Buffer::named(
            "host.offloaded_optimizer",
            Category::Optimizer,
            Device::Host,
            sim.host_bytes,
            Lifetime::Persistent,
        ));
    }
    Ok(TrainDetail {
        estimate: Estimate {
            plan,
            peak_bytes: sim.tape.peak_bytes + workspace_bytes,
            reserved_bytes: reserved,
            context_bytes: context_bytes(),
            host_peak_bytes: sim.host_bytes,
            phase_peaks: Some(phase_peaks),
        },
        steady_bytes: sim.param_bytes + sim.optimizer_bytes,
        after_forward_bytes: sim.after_forward_bytes + workspace_bytes,
        forward_peak_bytes: sim.forward_peak_bytes + workspace_bytes,
        workspace_bytes,
    })
}

/// The `pytorch` estimate of inference: prefill and one decode step.
#[derive(Clone, Debug)]
pub struct InferDetail {
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Peak of live tensors over the prefill (weights included).
    pub prefill_peak_bytes: u64,
    /// Peak over the next one-token step (the prefill's logits still held).
    pub decode_peak_bytes: u64,
    /// Includes `workspace_bytes`, like the peaks.
    pub reserved_bytes: u64,
    pub context_bytes: u64,
    pub workspace_bytes: u64,
}

/// `logits_to_keep`: `Some(1)` computes the last position's logits only (as `generate`),
/// `None` all of them.
pub fn inference_estimate(
    model: &ModelShape,
    setup: &InferSetup,
    logits_to_keep: Option<u64>,
) -> Result<InferDetail, PlanError> {
    let sim = infer::simulate(model, setup, logits_to_keep)?;
    let mut a = allocator::Allocator::default();
    let reserved = a.replay(&sim.tape) + 32 * MIB + 2 * MIB;
    let ws = CUBLAS_WORKSPACE_BYTES;
    Ok(InferDetail {
        weights_bytes: sim.weights_bytes,
        kv_cache_bytes: sim.kv_cache_bytes,
        prefill_peak_bytes: sim.prefill_peak_bytes + ws,
        decode_peak_bytes: sim.decode_peak_bytes + ws,
        reserved_bytes: reserved,
        context_bytes: context_bytes(),
        workspace_bytes: ws,
    })
}

fn workspace_buffer(bytes: u64) -> Buffer {
    Buffer::named(
        "cublas.workspace",
        Category::Other,
        Device::Gpu,
        bytes,
        Lifetime::Persistent,
    )
}

/// Folds the tape's tensors into plan buffers: one per (category, birth phase, death phase).
fn to_plan(tape: &Tape, n_layers: u32) -> MemoryPlan {
    let mut phase = Phase::Embed;
    let mut born: Vec<Option<Phase>> = vec![None; tape.tensors.len()];
    let mut spans: std::collections::BTreeMap<(Category, u32, u32), (Phase, Phase, u64)> =
        Default::default();
    let mut persistent: [u64; 6] = [0; 6];
    for e in &tape.events {
        match *e {
            Event::Phase(p) => phase = p,
            Event::Alloc(t) => born[t] = Some(phase),
            Event::Free(t) => {
                if let Some(b) = born[t].take() {
                    let c = tape.tensors[t].category;
                    let key = (c, b.ordinal(n_layers), phase.ordinal(n_layers));
                    spans.entry(key).or_insert((b, phase, 0)).2 += tape.tensors[t].bytes;
                }
            }
        }
    }
    for (t, b) in born.iter().enumerate() {
        if b.is_some() {
            persistent[tape.tensors[t].category as usize] += tape.tensors[t].bytes;
        }
    }
    let mut plan = MemoryPlan::new(n_layers);
    for c in Category::ALL {
        if persistent[c as usize] > 0 {
            plan.push(Buffer::named(
                format!("{c:?}").to_lowercase(),
                c,
                Device::Gpu,
                persistent[c as usize],
                Lifetime::Persistent,
            ));
        }
    }
    for ((c, _, _), (b, d, bytes)) in spans {
        let name = format!("{c:?}.{b:?}-{d:?}").to_lowercase();
        let life = Lifetime::Span { born: b, dies: d };
        plan.push(Buffer::named(name, c, Device::Gpu, bytes, life));
    }
    plan
}
