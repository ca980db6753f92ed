//! The `formula` runtime: the papers. analytic memory model as a buffer plan.
//!
//! Model states per precision policy and optimizer, ZeRO 0-3 over the data-parallel ranks (each
//! unit — the embedding, each block, the head — padded to a multiple of the ranks), the ZeRO-3
//! gathered unit and the prefetched next one, offload to host memory, LoRA/QLoRA, Korthikanti
//! activations ([`crate::acts`]) with recompute policies and the 1F1B pipeline's in-flight
//! micro-batches, the logits and the loss's fp32 upcast, and one gradient-reduce bucket. It is a
//! generic runtime, not a framework: `pytorch` and `frugal` are the profiles that match a real
//! process. Choices (documented, not measured): the reduce bucket holds DeepSpeed's default
//! 5×10^8 elements (capped at the rank's gradients); DDP (ZeRO 0) keeps buckets as large as the
//! gradients; the CUDA context is [`CONTEXT_BYTES`]; the allocator reserves exactly the peak.
//! Example: `formula::training_estimate(&presets::by_name("llama2-7b")?, &setup)?.peak_bytes`.

use crate::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use crate::params::TensorKind;
use crate::setup::{Offload, TrainSetup, ZeroStage};
use crate::{lora, Estimate, ModelShape, PlanError};

/// CUDA context and libraries, from the usual "CUDA context: ~0.5-1 GB" (the `pytorch` profile
/// uses the measured value instead).
pub const CONTEXT_BYTES: u64 = 768 << 20;

pub use crate::policy::Policy;

mod states;
use states::fp32_grad_elems;
pub use states::model_states_estimate;

/// Parameters of one ZeRO unit on one tensor-parallel rank.
#[derive(Clone, Copy, Debug, Default)]
struct Unit {
    /// Trainable elements (all of them, or the LoRA adapters).
    train: u64,
    /// Bytes of frozen base weights (LoRA), stored in the base format.
    frozen_bytes: u64,
}

fn tp_local(numel: u64, split: bool, tp: u32) -> u64 {
    if split {
        numel.div_ceil(tp as u64)
    } else {
        numel
    }
}

fn unit_of(tensors: &[crate::params::Tensor], setup: &TrainSetup) -> Unit {
    let mut u = Unit::default();
    for t in tensors {
        let n = tp_local(t.numel(), t.tp_split, setup.tp);
        match &setup.lora {
            None => u.train += n,
            Some(l) => {
                if lora::is_target(t, &l.targets) {
                    u.train += lora::adapter_numel(t, l.rank);
                }
                u.frozen_bytes += if t.kind == TensorKind::Linear {
                    lora::base_bytes(n, t.d_in, l.base)
                } else {
                    2 * n
                };
            }
        }
    }
    u
}

/// Which blocks a pipeline stage holds and how many micro-batches it keeps in flight.
#[derive(Clone, Copy, Debug)]
struct Stage {
    first_layer: u32,
    n_layers: u32,
    has_embed: bool,
    has_head: bool,
    /// 1F1B: stage i keeps min(pp - i, micro-batches) forward passes' activations.
    in_flight: u64,
}

fn stages(model: &ModelShape, setup: &TrainSetup) -> Vec<Stage> {
    let pp = setup.pp;
    let per = model.n_layers.div_ceil(pp);
    let stage = |i: u32| {
        let first_layer = (i * per).min(model.n_layers);
        Stage {
            first_layer,
            n_layers: (model.n_layers - first_layer).min(per),
            has_embed: i == 0,
            has_head: i == pp - 1,
            in_flight: ((pp - i) as u64).min(setup.grad_accum as u64),
        }
    };
    if pp == 1 {
        vec![stage(0)]
    } else {
        vec![stage(0), stage(pp - 1)]
    }
}

/// The formula runtime's buffer plan for the busiest pipeline stage of `model` under `setup`.
pub fn training_plan(model: &ModelShape, setup: &TrainSetup) -> Result<MemoryPlan, PlanError> {
    setup.validate(model)?;
    let plans = stages(model, setup)
        .into_iter()
        .map(|stage| StagePlan::new(model, setup, stage).build());
    Ok(plans
        .max_by_key(|p| p.peak_bytes(Device::Gpu))
        .expect("at least one stage"))
}

/// [`training_plan`] with the formula runtime's context constant.
pub fn training_estimate(model: &ModelShape, setup: &TrainSetup) -> Result<Estimate, PlanError> {
    let plan = training_plan(model, setup)?;
    Ok(estimate_of(plan))
}

fn estimate_of(plan: MemoryPlan) -> Estimate {
    let peak_bytes = plan.peak_bytes(Device::Gpu);
    Estimate {
        peak_bytes,
        reserved_bytes: peak_bytes,
        context_bytes: CONTEXT_BYTES,
        host_peak_bytes: plan.peak_bytes(Device::Host),
        phase_peaks: None,
        plan,
    }
}

/// Builds one stage's buffers.
struct StagePlan<'a> {
    model: &'a ModelShape,
    setup: &'a TrainSetup,
    stage: Stage,
    policy: Policy,
    plan: MemoryPlan,
}

fn span(born: Phase, dies: Phase) -> Lifetime {
    Lifetime::Span { born, dies }
}

impl<'a> StagePlan<'a> {
    fn new(model: &'a ModelShape, setup: &'a TrainSetup, stage: Stage) -> StagePlan<'a> {
        StagePlan {
            model,
            setup,
            stage,
            policy: Policy::of(setup.precision),
            plan: MemoryPlan::new(stage.n_layers),
        }
    }

    fn push(
        &mut self,
        name: String,
        category: Category,
        device: Device,
        bytes: u64,
        life: Lifetime,
    ) {
        if bytes > 0 {
            self.plan
                .push(Buffer::named(name, category, device, bytes, life));
        }
    }

    fn build(mut self) -> MemoryPlan {
        let units = self.units();
        self.model_states(&units);
        let view = self.stage_view();
        crate::formula_acts::activations(&mut self.plan, self.model, self.setup, &view);
        self.plan
    }

    fn stage_view(&self) -> crate::formula_acts::StageView {
        crate::formula_acts::StageView {
            first_layer: self.stage.first_layer,
            n_layers: self.stage.n_layers,
            has_embed: self.stage.has_embed,
            has_head: self.stage.has_head,
            in_flight: self.stage.in_flight,
            largest_linear_bytes: if self.setup.lora.as_ref().is_some_and(|l| l.base.bits() < 16) {
                self.largest_linear() * 2
            } else {
                0
            },
        }
    }

    fn largest_linear(&self) -> u64 {
        let layer = self.stage.first_layer.min(self.model.n_layers - 1);
        self.model
            .block_tensors(layer)
            .iter()
            .filter(|t| t.kind == TensorKind::Linear)
            .map(|t| tp_local(t.d_in * t.d_out, t.tp_split, self.setup.tp))
            .max()
            .unwrap_or(0)
    }

    /// (name, unit, phase its gradients appear in, forward gather span, backward gather span).
    fn units(&self) -> Vec<UnitRow> {
        let (m, s, st) = (self.model, self.setup, self.stage);
        let n = st.n_layers;
        let mut out = Vec::with_capacity(n as usize + 2);
        let last_fwd = if n > 0 {
            Phase::Forward(n - 1)
        } else {
            Phase::Embed
        };
        let tied_here = m.tied_embeddings && st.has_embed && st.has_head;
        if st.has_embed {
            let grad_phase = if tied_here {
                Phase::Head
            } else {
                Phase::EmbedBackward
            };
            let bwd_born = if n > 0 {
                Phase::Backward(0)
            } else {
                Phase::Head
            };
            let unit = unit_of(&m.embedding_tensors(), s);
            let fwd = (
                Phase::Embed,
                if tied_here { Phase::Head } else { Phase::Embed },
            );
            out.push((
                "embed".into(),
                unit,
                grad_phase,
                fwd,
                Some((bwd_born, Phase::EmbedBackward)),
            ));
        }
        let dense = unit_of(&m.block_tensors(0), s);
        let moe = m
            .moe
            .as_ref()
            .map(|x| unit_of(&m.block_tensors(x.first_dense), s));
        for i in 0..n {
            let layer = st.first_layer + i;
            let unit = match moe {
                Some(u) if m.is_moe_layer(layer) => u,
                _ => dense,
            };
            let fwd_born = if i == 0 {
                Phase::Embed
            } else {
                Phase::Forward(i - 1)
            };
            let bwd_born = if i + 1 == n {
                Phase::Head
            } else {
                Phase::Backward(i + 1)
            };
            out.push((
                format!("h.{layer}"),
                unit,
                Phase::Backward(i),
                (fwd_born, Phase::Forward(i)),
                Some((bwd_born, Phase::Backward(i))),
            ));
        }
        if st.has_head {
            let mut head = m.head_tensors();
            // A pipeline's last stage keeps its own copy of tied embeddings (as Megatron does).
            if m.tied_embeddings && !st.has_embed {
                head.extend(m.embedding_tensors().into_iter().take(1));
            }
            out.push((
                "head".into(),
                unit_of(&head, s),
                Phase::Head,
                (last_fwd, Phase::Head),
                None,
            ));
        }
        out
    }
}

type UnitRow = (String, Unit, Phase, (Phase, Phase), Option<(Phase, Phase)>);

impl StagePlan<'_> {
    /// Parameters, gradients, optimizer state, ZeRO-3 gathers and the reduce bucket.
    fn model_states(&mut self, units: &[UnitRow]) {
        let (s, p) = (self.setup, self.policy);
        let dp = s.dp as u64;
        let zero = s.zero as u8;
        let shard = |n: u64, sharded: bool| if sharded { n.div_ceil(dp) } else { n };
        let device = |host: bool| if host { Device::Host } else { Device::Gpu };
        let params_host = s.offload == Offload::Params;
        let opt_host = s.offload != Offload::None;
        let (mut weights, mut frozen, mut opt_elems, mut train_total) = (0, 0, 0, 0);
        for (_, u, ..) in units {
            weights += p.weight * shard(u.train, zero >= 3);
            frozen += shard(u.frozen_bytes, zero >= 3);
            opt_elems += shard(u.train, zero >= 1);
            train_total += u.train;
        }
        let persistent = Lifetime::Persistent;
        self.push(
            "params".into(),
            Category::Params,
            device(params_host),
            weights,
            persistent,
        );
        self.push(
            "params.frozen".into(),
            Category::Params,
            device(params_host),
            frozen,
            persistent,
        );
        let opt_bytes = p.optimizer_bytes(s.optimizer, opt_elems);
        self.push(
            "optimizer".into(),
            Category::Optimizer,
            device(opt_host),
            opt_bytes,
            persistent,
        );
        if opt_host {
            // The host optimizer steps on fp32 gradients of its partition (ZeRO-Offload).
            self.push(
                "grads.fp32".into(),
                Category::Grads,
                Device::Host,
                4 * opt_elems,
                persistent,
            );
        } else if let Some(elems) = fp32_grad_elems(s, opt_elems) {
            // The fp32 master step upcasts the rank's gradient partition (DeepSpeed, Megatron).
            let life = span(Phase::Optimizer, Phase::Optimizer);
            self.push(
                "grads.fp32".into(),
                Category::Grads,
                Device::Gpu,
                4 * elems,
                life,
            );
        }
        for (name, u, grad_phase, fwd, bwd) in units {
            self.unit_grads(name, u, *grad_phase);
            if zero >= 3 || params_host {
                let full = p.weight * u.train + u.frozen_bytes;
                let (born, dies) = *fwd;
                self.push(
                    format!("{name}.gathered"),
                    Category::Other,
                    Device::Gpu,
                    full,
                    span(born, dies),
                );
                if let Some((born, dies)) = *bwd {
                    let life = span(born, dies);
                    self.push(
                        format!("{name}.gathered_bwd"),
                        Category::Other,
                        Device::Gpu,
                        full,
                        life,
                    );
                }
            }
        }
        self.comm_buckets(train_total);
    }

    /// A unit's gradients: whole (ZeRO 0-1) or a shard plus the transient whole gradient that is
    /// reduce-scattered right after the unit's backward (ZeRO 2-3). With gradient accumulation they
    /// persist across micro-batches; otherwise they are born in backward and freed after the step.
    fn unit_grads(&mut self, name: &str, u: &Unit, grad_phase: Phase) {
        let (s, p) = (self.setup, self.policy);
        let keep = if s.grad_accum > 1 {
            Lifetime::Persistent
        } else {
            span(grad_phase, Phase::Optimizer)
        };
        let whole = p.grad * u.train;
        if (s.zero as u8) < 2 {
            self.push(
                format!("{name}.grad"),
                Category::Grads,
                Device::Gpu,
                whole,
                keep,
            );
            return;
        }
        if s.offload == Offload::None {
            let shard = p.grad * u.train.div_ceil(s.dp as u64);
            self.push(
                format!("{name}.grad_shard"),
                Category::Grads,
                Device::Gpu,
                shard,
                keep,
            );
        }
        let life = span(grad_phase, grad_phase);
        self.push(
            format!("{name}.grad_full"),
            Category::Grads,
            Device::Gpu,
            whole,
            life,
        );
    }

    fn comm_buckets(&mut self, train_total: u64) {
        let (s, p) = (self.setup, self.policy);
        if s.dp == 1 {
            return;
        }
        if s.zero == ZeroStage::Zero0 {
            // DDP keeps flat buckets covering every gradient for the life of the model.
            let bytes = p.grad * train_total;
            self.push(
                "comm.ddp_buckets".into(),
                Category::Other,
                Device::Gpu,
                bytes,
                Lifetime::Persistent,
            );
        } else {
            let bytes = p.grad * train_total.min(s.zero_buffers.reduce_bucket);
            let life = span(Phase::Head, Phase::EmbedBackward);
            self.push(
                "comm.reduce_bucket".into(),
                Category::Other,
                Device::Gpu,
                bytes,
                life,
            );
        }
    }
}
