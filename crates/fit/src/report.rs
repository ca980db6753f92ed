//! The plan's report: the JSON contract of docs/cli.md (`per_device`, `host`), an echo of the model
//! and setup, the parameter count, the phase of the peak and memory over the step.
//!
//! Categories in `per_device` are those live at the moment of the peak, so they sum to
//! `peak_bytes`; a profile whose peak comes from a finer simulation than the phase timeline
//! (`Estimate::peak_bytes` above the timeline's) books the difference as `other_bytes`. Not here:
//! printing, tables, plots (the CLI). Example:
//! `serde_json::to_string(&report::training("formula", Some(&shape), &setup, &estimate))`.

use plan::buffer::{Device, Phase};
use plan::{Estimate, InferEstimate, InferSetup, ModelShape, TrainSetup};
use serde::Serialize;

/// Bytes per category, named as the JSON contract names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub params_bytes: u64,
    pub grads_bytes: u64,
    pub optimizer_bytes: u64,
    pub activations_bytes: u64,
    pub kv_cache_bytes: u64,
    pub other_bytes: u64,
}

impl Breakdown {
    pub fn from_categories(c: [u64; 6]) -> Breakdown {
        Breakdown {
            params_bytes: c[0],
            grads_bytes: c[1],
            optimizer_bytes: c[2],
            activations_bytes: c[3],
            kv_cache_bytes: c[4],
            other_bytes: c[5],
        }
    }

    pub fn sum(&self) -> u64 {
        self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.kv_cache_bytes
            + self.other_bytes
    }
}

/// `per_device` of the JSON contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PerDevice {
    #[serde(flatten)]
    pub categories: Breakdown,
    pub peak_bytes: u64,
    pub reserved_bytes: u64,
    pub context_bytes: u64,
    pub total_bytes: u64,
}

impl PerDevice {
    /// The breakdown `at_peak` with the process totals: `total` is the reserve plus the context
    /// (what `nvidia-smi` shows).
    fn of(at_peak: [u64; 6], (peak, reserved, context): (u64, u64, u64)) -> PerDevice {
        PerDevice {
            categories: Breakdown::from_categories(at_peak),
            peak_bytes: peak,
            reserved_bytes: reserved,
            context_bytes: context,
            total_bytes: reserved + context,
        }
    }
}

/// `host`: what offload keeps in host memory, at the host's peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Host {
    #[serde(flatten)]
    pub categories: Breakdown,
    pub peak_bytes: u64,
}

/// Live bytes at one phase of the step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimelinePoint {
    pub phase: String,
    #[serde(flatten)]
    pub categories: Breakdown,
    pub live_bytes: u64,
}

/// Inference-only facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InferDetails {
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub kv_waste_bytes: u64,
    pub prefill_peak_bytes: u64,
    pub decode_peak_bytes: u64,
}

/// The model's largest pieces, as DeepSpeed and accelerate report them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Largest {
    /// DeepSpeed's `largest_layer_params`: the biggest single module (a matrix or a table).
    pub module: &'static str,
    pub module_params: u64,
    /// accelerate's "largest layer": the biggest unit (embedding, block, head).
    pub unit: &'static str,
    pub unit_params: u64,
}

impl Largest {
    pub fn of(m: &ModelShape) -> Largest {
        let (module, module_params) = m.largest_module();
        let (unit, unit_params) = m.largest_unit();
        Largest {
            module,
            module_params,
            unit,
            unit_params,
        }
    }
}

/// A training config a setup was read from (`frugal plan --deepspeed`, `--accelerate`).
#[derive(Clone, Debug, Serialize)]
pub struct ConfigSource {
    pub file: String,
    /// What the config set, in one line.
    pub summary: String,
    /// Settings read that change device memory in ways the planner does not model.
    pub not_planned: Vec<String>,
}

/// One plan, ready to print as a table or as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub runtime: String,
    /// Why the runtime differs from the one asked for (`auto` falling back), if it does.
    pub runtime_note: Option<String>,
    /// The DeepSpeed or accelerate config the setup was read from, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigSource>,
    /// `"train"` or `"infer"`.
    pub mode: &'static str,
    /// The shape planned, absent for a bare parameter count.
    pub model: Option<ModelShape>,
    pub param_count: u64,
    /// The largest module and unit (absent for a bare parameter count).
    pub largest: Option<Largest>,
    pub setup: serde_json::Value,
    pub per_device: PerDevice,
    pub host: Option<Host>,
    /// Host memory of one node of 8 GPUs (or fewer, as the run has): offload and loading.
    pub host_node: Option<plan::host::HostNode>,
    pub peak_phase: String,
    pub timeline: Vec<TimelinePoint>,
    pub inference: Option<InferDetails>,
    /// Predicted step time on a GPU (`frugal plan --gpu`), the object `fit` ranks by.
    pub step_time: Option<crate::StepTime>,
    /// The GPU `step_time` is for.
    pub gpu: Option<String>,
    pub device_memory_bytes: Option<u64>,
    pub fits: Option<bool>,
    /// When a training setup does not fit: the nearest one that does ([`crate::cheapest_fix`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<crate::Suggestion>,
    /// The `frugal` runtime under tensor or pipeline parallelism: every rank's peak (the
    /// report's own numbers are the busiest rank's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rank_peaks: Vec<RankPeak>,
}

pub use plan::runtime::RankPeak;

/// Every rank's peak under `setup` in the `frugal` runtime, stage by stage (empty without
/// tensor or pipeline parallelism).
pub fn rank_peaks(
    model: &ModelShape,
    setup: &TrainSetup,
) -> Result<Vec<RankPeak>, plan::PlanError> {
    if setup.tp <= 1 && setup.pp <= 1 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for tp_rank in 0..setup.tp.max(1) {
        for (stage, plan) in plan_frugal::stage_plans(model, setup, tp_rank)? {
            out.push(RankPeak {
                stage: stage.index,
                first_layer: stage.first_layer,
                layers: stage.layers,
                tp_rank,
                peak_bytes: plan.peak_bytes(plan::buffer::Device::Gpu),
            });
        }
    }
    out.sort_by_key(|r| (r.stage, r.tp_rank));
    Ok(out)
}

/// Makes the categories at the peak sum to the profile's `peak_bytes`. A profile that finds its
/// peak by a finer simulation than the phase timeline may see more (the difference is booked as
/// other) or less (the phase view counts tensors born and freed inside one phase as live together:
/// the excess comes off activations first, then other).
pub fn reconcile(mut c: [u64; 6], peak_bytes: u64) -> [u64; 6] {
    let sum: u64 = c.iter().sum();
    if peak_bytes >= sum {
        c[5] += peak_bytes - sum;
        return c;
    }
    let mut excess = sum - peak_bytes;
    for i in [3, 5, 1, 4, 2, 0] {
        let cut = excess.min(c[i]);
        c[i] -= cut;
        excess -= cut;
    }
    c
}

/// A phase as the report writes it: `embed`, `forward.3`, `head`, `backward.3`, ...
pub fn phase_name(phase: Phase) -> String {
    match phase {
        Phase::Embed => "embed".into(),
        Phase::Forward(l) => format!("forward.{l}"),
        Phase::Head => "head".into(),
        Phase::Backward(l) => format!("backward.{l}"),
        Phase::EmbedBackward => "embed_backward".into(),
        Phase::Optimizer => "optimizer".into(),
        Phase::Prefill => "prefill".into(),
        Phase::Decode => "decode".into(),
    }
}

fn point(phase: String, c: [u64; 6]) -> TimelinePoint {
    TimelinePoint {
        phase,
        categories: Breakdown::from_categories(c),
        live_bytes: c.iter().sum(),
    }
}

/// The report of a training estimate; `model` is `None` for a bare count of `n_params`.
pub fn training(
    runtime: &str,
    model: Option<&ModelShape>,
    n_params: u64,
    setup: &TrainSetup,
    est: &Estimate,
) -> Report {
    let (phase, at_peak) = est.at_peak();
    let at_peak = reconcile(at_peak, est.peak_bytes);
    let host = (est.host_peak_bytes > 0).then(|| {
        let (_, c) = est.plan.at_peak(Device::Host);
        Host {
            categories: Breakdown::from_categories(c),
            peak_bytes: est.host_peak_bytes,
        }
    });
    let timeline = est
        .timeline()
        .into_iter()
        .map(|(p, c)| point(phase_name(p), c))
        .collect();
    let totals = (est.peak_bytes, est.reserved_bytes, est.context_bytes);
    let per_device = PerDevice::of(at_peak, totals);
    Report {
        host,
        host_node: model.map(|m| plan::host::host_per_node(m, setup, est, 8)),
        peak_phase: phase_name(phase),
        timeline,
        ..Report::new(runtime, "train", model, n_params, setup, per_device)
    }
}

/// The report of an inference estimate; `setup` is `None` for a bare parameter count.
pub fn inference(
    runtime: &str,
    model: Option<&ModelShape>,
    n_params: u64,
    setup: &InferSetup,
    est: &InferEstimate,
) -> Report {
    let prefill_peak: u64 = est.prefill.iter().sum();
    let decode_peak: u64 = est.decode.iter().sum();
    let at_peak = reconcile(est.at_peak(), est.peak_bytes);
    let totals = (est.peak_bytes, est.reserved_bytes, est.context_bytes);
    let per_device = PerDevice::of(at_peak, totals);
    Report {
        peak_phase: if prefill_peak >= decode_peak {
            "prefill"
        } else {
            "decode"
        }
        .into(),
        timeline: vec![
            point("prefill".into(), est.prefill),
            point("decode".into(), est.decode),
        ],
        inference: Some(InferDetails {
            weights_bytes: est.weights_bytes,
            kv_bytes_per_token: est.kv_bytes_per_token,
            kv_waste_bytes: est.kv_waste_bytes,
            prefill_peak_bytes: prefill_peak,
            decode_peak_bytes: decode_peak,
        }),
        ..Report::new(runtime, "infer", model, n_params, setup, per_device)
    }
}

impl Report {
    /// A report of `mode` with what every plan has: the runtime, the model (or a bare count of
    /// `n_params`), the setup and `per_device`; the rest empty, for the caller to fill.
    fn new(
        runtime: &str,
        mode: &'static str,
        model: Option<&ModelShape>,
        n_params: u64,
        setup: &impl Serialize,
        per_device: PerDevice,
    ) -> Report {
        Report {
            runtime: runtime.into(),
            runtime_note: None,
            config: None,
            mode,
            model: model.cloned(),
            param_count: model.map_or(n_params, ModelShape::param_count),
            largest: model.map(Largest::of),
            setup: serde_json::to_value(setup).unwrap_or_default(),
            per_device,
            host: None,
            host_node: None,
            peak_phase: String::new(),
            timeline: Vec::new(),
            inference: None,
            step_time: None,
            gpu: None,
            device_memory_bytes: None,
            fix: None,
            fits: None,
            rank_peaks: Vec::new(),
        }
    }

    /// Says whether the whole process (`total_bytes`) fits in `device_bytes`.
    pub fn with_device_memory(mut self, device_bytes: u64) -> Report {
        self.device_memory_bytes = Some(device_bytes);
        self.fits = Some(self.per_device.total_bytes <= device_bytes);
        self
    }
}
