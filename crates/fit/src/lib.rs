//! The advisor: which training setups fit a device's memory, ranked by predicted step time.
//!
//! [`search`] weighs every candidate of [`space`] (ZeRO stage, offload, recompute, micro-batch with
//! accumulation at the same global batch, attention kernel, TP/PP layout, LoRA when allowed) with
//! a runtime profile's memory estimate and [`cost`]'s step time, ranks what fits by step time
//! with the usual remedy order ([`remedy`]) breaking ties, and keeps the rest for [`why_not`].
//! [`cheapest_fix`] answers the engine's question when a run does not fit: the nearest setup that
//! does; [`report`] turns an estimate into the report `plan` and `fit` print. Pure: no clocks, no
//! IO. Example:
//! `fit::search(&presets::by_name("llama2-7b")?, &FitRequest::new(32, 2048, 8, 80 << 30))?.best()`.

mod check;
pub mod cost;
pub mod fix;
pub mod hardware;
pub mod infer;
pub mod remedy;
pub mod report;
pub mod space;
pub mod why;

pub use check::check_request;
pub use cost::{step_time, zero_comm_volume, Bottleneck, CommVolume, StepTime};
pub use fix::{cheapest_fix, Suggestion};
pub use hardware::{gpu_by_name, Gpu, Hardware, GPUS};
pub use remedy::Remedy;
pub use why::{why_not, MissGroup};

use plan::setup::{Attention, Offload, Optimizer, Precision, Recompute, TrainSetup, ZeroStage};
use plan::{Estimate, ModelShape, PlanError};
use serde::Serialize;

/// The memory model a search asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// The analytic model of the papers: every setup.
    Formula,
    /// PyTorch + HF transformers: one GPU, no ZeRO/TP/PP/offload (others are `Unsupported`).
    Pytorch,
    /// This project's engine, exact: what it runs today.
    Frugal,
}

impl Runtime {
    pub fn parse(name: &str) -> Result<Runtime, PlanError> {
        match name {
            "formula" => Ok(Runtime::Formula),
            "pytorch" => Ok(Runtime::Pytorch),
            "frugal" => Ok(Runtime::Frugal),
            other => Err(PlanError::Invalid {
                field: "--runtime".into(),
                reason: format!("'{other}' is not a runtime: use formula, pytorch or frugal"),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Runtime::Formula => "formula",
            Runtime::Pytorch => "pytorch",
            Runtime::Frugal => "frugal",
        }
    }

    /// This runtime's estimate of one step of `setup`.
    pub fn estimate(self, model: &ModelShape, setup: &TrainSetup) -> Result<Estimate, PlanError> {
        match self {
            Runtime::Formula => plan::formula::training_estimate(model, setup),
            Runtime::Pytorch => {
                setup.validate(model)?;
                plan_pytorch::training_estimate(model, setup)
            }
            Runtime::Frugal => {
                setup.validate(model)?;
                plan_frugal::training_estimate(model, setup)
            }
        }
    }
}

/// Limits on the space searched: pinned degrees, and the floor [`cheapest_fix`] keeps (it never
/// undoes a remedy the user already chose).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Bounds {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub min_zero: Option<ZeroStage>,
    pub min_offload: Option<Offload>,
    /// Only flash attention (the user runs flash already).
    pub flash_only: bool,
    /// Only this recompute policy.
    pub recompute: Option<Recompute>,
}

impl Bounds {
    pub fn allows(&self, zero: ZeroStage, offload: Offload) -> bool {
        self.min_zero.is_none_or(|z| zero as u8 >= z as u8)
            && self.min_offload.is_none_or(|o| offload as u8 >= o as u8)
    }
    pub fn allows_recompute(&self, r: Recompute) -> bool {
        self.recompute.is_none_or(|x| x == r)
    }
    pub fn allows_attention(&self, a: Attention) -> bool {
        !self.flash_only || a == Attention::Flash
    }
}

/// LoRA adapters a search may propose (`--allow-lora`): they change what is trained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoraChoice {
    pub rank: u32,
    pub targets: Vec<String>,
}

/// What the user asks `fit`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FitRequest {
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// Sequences per optimizer step over all GPUs.
    pub global_batch: u64,
    pub seq: u64,
    pub gpus: u32,
    /// Memory of one device; a setup fits when its `total_bytes` is at most
    /// [`FitRequest::usable_bytes`].
    pub capacity_bytes: u64,
    /// Fraction of the capacity kept free (a safety margin; `frugal fit --headroom`, 0.05).
    pub headroom: f64,
    /// Host memory of one node (`--host-memory`); `None`: not limited.
    pub host_capacity_bytes: Option<u64>,
    pub hardware: Hardware,
    pub runtime: Runtime,
    /// The attention kernel the user runs today: with `Eager`, flash is a remedy.
    pub attention: Attention,
    /// `Some` when LoRA/QLoRA may be proposed.
    pub lora: Option<LoraChoice>,
    /// Keep the precision and optimizer asked for (no pure-bf16 or 8-bit Adam proposals).
    pub keep_states: bool,
    pub bounds: Bounds,
}

impl FitRequest {
    /// bf16 + AdamW on H100s at the default MFU, formula runtime, flash attention, no LoRA.
    pub fn new(global_batch: u64, seq: u64, gpus: u32, capacity_bytes: u64) -> FitRequest {
        FitRequest {
            precision: Precision::Bf16,
            optimizer: Optimizer::AdamW,
            global_batch,
            seq,
            gpus,
            capacity_bytes,
            headroom: 0.0,
            host_capacity_bytes: None,
            hardware: Hardware::of(hardware::GPUS[0]),
            runtime: Runtime::Formula,
            attention: Attention::Flash,
            lora: None,
            keep_states: false,
            bounds: Bounds::default(),
        }
    }

    /// The bytes a candidate may total: the capacity less the headroom.
    pub fn usable_bytes(&self) -> u64 {
        (self.capacity_bytes as f64 * (1.0 - self.headroom)) as u64
    }

    /// The plain setup remedies are counted from: all GPUs data-parallel, ZeRO 0, the whole
    /// per-rank batch in one micro-batch, no recompute, no offload, the user's attention.
    pub fn baseline(&self) -> TrainSetup {
        TrainSetup {
            precision: self.precision,
            optimizer: self.optimizer,
            dp: self.gpus,
            attention: self.attention,
            ..TrainSetup::new(
                (self.global_batch / self.gpus.max(1) as u64).max(1),
                self.seq,
            )
        }
    }
}

/// Memory of one candidate, as its runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub peak_bytes: u64,
    pub reserved_bytes: u64,
    pub context_bytes: u64,
    /// What `nvidia-smi` would show: compared with the capacity.
    pub total_bytes: u64,
    /// Host memory of one rank's offloaded state.
    pub host_peak_bytes: u64,
    /// Host memory of one node: every rank's offloaded state, or the load-time model copies
    /// ([`plan::host`]), whichever is larger.
    pub host_node_bytes: u64,
}

impl Memory {
    pub fn of(e: &Estimate) -> Memory {
        Memory {
            peak_bytes: e.peak_bytes,
            reserved_bytes: e.reserved_bytes,
            context_bytes: e.context_bytes,
            total_bytes: e.total_bytes(),
            host_peak_bytes: e.host_peak_bytes,
            host_node_bytes: e.host_peak_bytes,
        }
    }

    /// [`Memory::of`] with the node's host memory for `setup` on `model`.
    pub fn of_setup(model: &ModelShape, setup: &TrainSetup, e: &Estimate, per_node: u32) -> Memory {
        Memory {
            host_node_bytes: plan::host::host_per_node(model, setup, e, per_node).peak_bytes,
            ..Memory::of(e)
        }
    }
}

/// What became of one candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    Fits {
        memory: Memory,
        time: StepTime,
    },
    TooBig {
        memory: Memory,
    },
    /// The runtime does not model this setup (or refused it), with its reason.
    Unsupported {
        reason: String,
    },
}

/// One weighed candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Weighed {
    pub setup: TrainSetup,
    /// Remedies relative to the request's baseline, in the usual order.
    pub remedies: Vec<Remedy>,
    pub outcome: Outcome,
}

impl Weighed {
    pub fn memory(&self) -> Option<Memory> {
        match self.outcome {
            Outcome::Fits { memory, .. } | Outcome::TooBig { memory } => Some(memory),
            Outcome::Unsupported { .. } => None,
        }
    }
    pub fn time(&self) -> Option<StepTime> {
        match self.outcome {
            Outcome::Fits { time, .. } => Some(time),
            _ => None,
        }
    }
}

/// Everything a search found.
#[derive(Clone, Debug, Serialize)]
pub struct FitResult {
    pub candidates_weighed: usize,
    /// Setups that fit, best first.
    pub fitting: Vec<Weighed>,
    pub too_big: Vec<Weighed>,
    pub unsupported: Vec<Weighed>,
    pub baseline: TrainSetup,
    /// When LoRA was not allowed and full fine-tuning does not fit or is at least
    /// [`LORA_HINT_SLOWDOWN`] × slower: the best LoRA/QLoRA setup (rank 16, every linear layer).
    pub lora_hint: Option<Weighed>,
}

/// How much slower full fine-tuning must be than LoRA before `fit` mentions LoRA unasked.
pub const LORA_HINT_SLOWDOWN: f64 = 10.0;

impl FitResult {
    pub fn best(&self) -> Option<&Weighed> {
        self.fitting.first()
    }
}

pub use plan::setup::dtype_name;

/// Weighs `setup`: its memory under `runtime` against `capacity_bytes`, and its step time if it fits.
pub fn weigh(
    model: &ModelShape,
    setup: &TrainSetup,
    baseline: &TrainSetup,
    r: &FitRequest,
) -> Weighed {
    let outcome = match r.runtime.estimate(model, setup) {
        Err(e) => Outcome::Unsupported {
            reason: e.to_string(),
        },
        Ok(e) => {
            let memory = Memory::of_setup(model, setup, &e, r.hardware.gpus_per_node);
            let host_ok = r
                .host_capacity_bytes
                .is_none_or(|h| memory.host_node_bytes <= h);
            if memory.total_bytes <= r.usable_bytes() && host_ok {
                let time = step_time(model, setup, &r.hardware);
                Outcome::Fits { memory, time }
            } else {
                Outcome::TooBig { memory }
            }
        }
    };
    Weighed {
        setup: setup.clone(),
        remedies: Remedy::of(baseline, setup),
        outcome,
    }
}

/// Step times within 0.1% of each other tie, and the usual order decides.
fn time_bucket(step_s: f64) -> i64 {
    (step_s.ln() / 0.001f64.ln_1p()).round() as i64
}

/// The usual-order part of a ranking key: remedy count, remedy indices, each remedy's weight.
pub type TieKey = (usize, Vec<u8>, Vec<u64>);

/// A setup with leaner optimizer state (pure bf16, 8-bit Adam) changes the update's numerics: it
/// ranks above one that keeps the user's only when it is at least this much faster.
pub const LEAN_STATES_SPEEDUP: f64 = 1.25;

/// Sort key of a fitting candidate: step time (leaner states handicapped by
/// [`LEAN_STATES_SPEEDUP`]), then the usual remedy order, then the lower total.
fn rank_key(w: &Weighed) -> (i64, TieKey, u64) {
    let handicap = if w.remedies.contains(&Remedy::LeanStates) {
        LEAN_STATES_SPEEDUP
    } else {
        1.0
    };
    let t = w.time().map_or(f64::MAX, |t| t.step_s * handicap);
    let total = w.memory().map_or(u64::MAX, |m| m.total_bytes);
    (
        time_bucket(t),
        remedy::tie_key(&w.remedies, &w.setup),
        total,
    )
}

/// Weighs every candidate of `r` for `model` and ranks those that fit.
pub fn search(model: &ModelShape, r: &FitRequest) -> Result<FitResult, PlanError> {
    let lora = match &r.lora {
        Some(l) => l.variants(),
        None => vec![None],
    };
    search_with(model, r, &lora, true)
}

/// [`search`] over the LoRA variants `lora`; `hint` allows the LoRA hint's own search.
fn search_with(
    model: &ModelShape,
    r: &FitRequest,
    lora: &[Option<plan::setup::Lora>],
    hint: bool,
) -> Result<FitResult, PlanError> {
    check_request(model, r)?;
    let baseline = r.baseline();
    let template = TrainSetup {
        dp: 1,
        ..baseline.clone()
    };
    let mut states = if r.keep_states {
        vec![(r.precision, r.optimizer)]
    } else {
        space::state_variants(r.precision, r.optimizer)
    };
    // This engine trains LoRA adapters in fp32 over the frozen base (`frugal::adapters`).
    let engine_lora = r.runtime == Runtime::Frugal && lora.iter().any(Option::is_some);
    if engine_lora && !states.contains(&(Precision::Fp32, Optimizer::AdamW)) {
        states.push((Precision::Fp32, Optimizer::AdamW));
    }
    let fixed = space::Fixed {
        template: &template,
        global_batch: r.global_batch,
        gpus: r.gpus,
        gpus_per_node: r.hardware.gpus_per_node,
        bounds: &r.bounds,
        lora,
        states: &states,
    };
    let (mut fitting, mut too_big, mut unsupported) = (Vec::new(), Vec::new(), Vec::new());
    let mut weighed = 0;
    space::for_each_candidate(model, &fixed, |s| {
        weighed += 1;
        let w = weigh(model, s, &baseline, r);
        match w.outcome {
            Outcome::Fits { .. } => fitting.push(w),
            Outcome::TooBig { .. } => too_big.push(w),
            Outcome::Unsupported { .. } => unsupported.push(w),
        }
    });
    let mut keyed: Vec<_> = fitting.into_iter().map(|w| (rank_key(&w), w)).collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let fitting: Vec<Weighed> = keyed.into_iter().map(|(_, w)| w).collect();
    // LoRA's matmuls are at least two thirds of full fine-tuning's, so it can be 10x faster
    // only where the best full setup is not compute-bound (offload, communication).
    let slow = fitting
        .first()
        .and_then(Weighed::time)
        .is_none_or(|t| t.bottleneck != Bottleneck::Compute);
    let lora_hint = if r.lora.is_none() && hint && slow {
        lora_hint(model, r, fitting.first())?
    } else {
        None
    };
    Ok(FitResult {
        candidates_weighed: weighed,
        fitting,
        too_big,
        unsupported,
        baseline,
        lora_hint,
    })
}

/// The best LoRA setup, when full fine-tuning's `best` is missing or much slower than it.
fn lora_hint(
    model: &ModelShape,
    r: &FitRequest,
    best: Option<&Weighed>,
) -> Result<Option<Weighed>, PlanError> {
    let choice = LoraChoice {
        rank: 16,
        targets: vec!["all-linear".into()],
    };
    if plan::lora::check_targets(model, &choice.targets).is_err() {
        return Ok(None);
    }
    let variants: Vec<_> = choice
        .variants()
        .into_iter()
        .filter(Option::is_some)
        .collect();
    let with = FitRequest {
        lora: Some(choice),
        keep_states: true,
        ..r.clone()
    };
    let res = search_with(model, &with, &variants, false)?;
    let Some(lora) = res.fitting.into_iter().find(|w| w.setup.lora.is_some()) else {
        return Ok(None);
    };
    let full_s = best.and_then(|b| b.time()).map(|t| t.step_s);
    let lora_s = lora.time().map_or(f64::MAX, |t| t.step_s);
    Ok(match full_s {
        Some(s) if s < LORA_HINT_SLOWDOWN * lora_s => None,
        _ => Some(lora),
    })
}
