//! ZeRO in the `frugal` runtime: which model-state buffers one rank holds at each stage, and
//! the stage-3 gathers (which unit is all-gathered into which buffer, born when, used when).
//!
//! With N ranks every unit is padded to a multiple of N and split into N equal shards of
//! `padded_numel / N` elements; rank r owns elements `r·shard .. (r+1)·shard`.
//!
//! | stage | params | grads | optimizer (Adam m, v) |
//! |---|---|---|---|
//! | 0 | `params.<u>` full | `grads.<u>` full, persistent | full |
//! | 1 | `params.<u>` full | `grads.<u>` full, persistent (reduce-scattered in place) | shard |
//! | 2 | `params.<u>` full | `grads.<u>` full while the backward writes it, then `grads.shard.<u>` | shard |
//! | 3 | `params.shard.<u>` | as stage 2 | shard |
//!
//! Stage 3 gathers every unit into `gather.fwd.<u>` for its forward (the embedding at `Embed`,
//! block l at `Forward(l)`, the head at `Head`, where its forward and backward both run) and
//! every block again into `gather.bwd.h.<l>` for its backward. With tied embeddings the head
//! also needs the token embedding: `gather.head.embed`. The embedding's backward reads no
//! weights, so it has no backward gather. Under a segment recompute policy the backward of a
//! segment's last block re-runs the whole segment's forward, so each block's backward gather is
//! born there and serves both the recompute and the block's own backward: one gather per unit
//! per backward, never two. Prefetch: at stage 3 every gather is born one phase before its first
//! use (the next unit is gathered while the current one computes), which costs one more unit's
//! bytes; below stage 3 (fp16 weights widened from the rank's own whole copy, 2-byte units'
//! vectors; no communication to hide) a gather is born where it is first used.
//! Gathered units count as `Other` (the "gathered working set"), so `params_bytes` is
//! exactly the shard: model state is (4 + 4 + 8)·Ψ/N = 16Ψ/N bytes per rank for fp32 AdamW.
//!
//! 2-byte units (`ActPolicy`'s `bf16_units`: bf16 without LoRA) never exist in fp32 as a
//! whole: the GEMMs, the embedding and the classifier read the 2-byte weights where they lie
//! (the working copy below stage 3, the bits gathered at stage 3, [`Holds::Bits`]), and only a
//! unit's vectors (`Unit::vectors`: norm weights and biases, a few C each) are widened for the
//! fp32 kernels, on the gathers' schedule (`gather.fwd.<u>.vectors`, [`Holds::Vectors`]).
//! Their gradients are written in 2 bytes directly ([`direct_grads`]) — into the whole
//! accumulator at stages 0-1 (reduced once at the end of the step, as fp32's full gradients),
//! into a 2-byte span at stages 2-3 — the vectors' through `grads.<u>.vectors` (fp32, while
//! the backward writes them, rounded in at the end of the unit's last phase). So a bf16 step
//! holds 2 + 2 + 4 + 8 bytes per parameter and nothing unit-sized in fp32, and never peaks
//! above the fp32 step of the same shape.
//!
//! Gradient accumulation: stages 0 and 1 accumulate full gradients locally over the K
//! micro-steps and reduce once at the end (all-reduce / reduce-scatter: 2Ψ of traffic per
//! step, 4Ψ of persistent gradient memory). Stages 2 and 3 reduce-scatter each unit's gradient
//! at the end of the phase that finishes it, every micro-step, and add the result into the
//! persistent shard `grads.shard.<u>` (4Ψ/N): K reduce-scatters per step (K·Ψ of traffic) but
//! never more than one unit's full gradient live (two with tied embeddings: the embedding's
//! lives from `Head` to `EmbedBackward`).
//!
//! Example: `gathers(&gpt2_tiny, &units, ActPolicy::PLAIN, true)` lists `gather.fwd.h.0` born
//! in `Embed`, dying in `Forward(0)`, and `gather.bwd.h.1` born in `Head`, dying in
//! `Backward(1)`.

mod gathers;
pub use gathers::{gathers, Gather, Holds};

use super::acts::ActPolicy;
use super::key::Key;
use super::units::{Unit, UnitKind};
use plan::buffer::{Buffer, Category, Device, Lifetime, Phase};
use plan::setup::{Optimizer, Precision, TrainSetup, ZeroStage};
use plan::{ModelShape, PlanError};

/// How a ZeRO stage, the weight precision and optimizer offload store one unit's model state:
/// the one rule the plan emits buffers from and the engine's `zero::Sharding` obeys.
///
/// | question | fp32 | bf16/fp16 |
/// |---|---|---|
/// | weights | `params.<u>` whole at 0-2, `params.shard.<u>` at 3 | the same, 2-byte |
/// | what the kernels read | `params.<u>`; stage 3 `gather.*` | fp16: fp32 `gather.*` at every stage; bf16: the 2-byte `params.<u>` (stage 3 `gather.*` bits) and fp32 `gather.*.vectors` |
/// | full gradient | persistent at 0-1; a span at 2-3 | fp16: an fp32 span at every stage; bf16 ([`direct_grads`]): none at 0-1, a 2-byte span at 2-3, fp32 `grads.<u>.vectors` |
/// | accumulator | the full gradient at 0-1; `grads.shard.<u>` at 2-3 | 2-byte `grads.shard.<u>`, whole at 0-1 |
/// | optimizer state | whole at 0, shard at 1-3 | + fp32 `master.<u>`; on the host with offload |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRule {
    pub zero: ZeroStage,
    pub world: u32,
    /// Bytes per element of the working weights and the gradient accumulator: 4 or 2.
    pub elem_bytes: u64,
    pub optimizer: Optimizer,
    /// Master weights and optimizer moments live on the host (`--offload optimizer`).
    pub optimizer_on_host: bool,
}

impl StateRule {
    pub fn of(setup: &TrainSetup) -> StateRule {
        StateRule {
            zero: setup.zero,
            world: setup.dp,
            elem_bytes: if setup.precision == Precision::Fp32 {
                4
            } else {
                2
            },
            optimizer: setup.optimizer,
            optimizer_on_host: setup.offload == plan::setup::Offload::Optimizer,
        }
    }

    /// 2-byte weights and gradients with fp32 master weights.
    pub fn is_half(&self) -> bool {
        self.elem_bytes == 2
    }

    /// Only a shard of each unit's weights persists (stage 3).
    pub fn params_sharded(&self) -> bool {
        self.zero == ZeroStage::Zero3
    }

    /// The kernels read copies gathered on the stage-3 schedule: at stage 3, and at every stage
    /// with 2-byte weights (fp16 widened whole, bf16 units' vectors).
    pub fn gathers(&self) -> bool {
        self.params_sharded() || self.is_half()
    }

    /// A unit's full gradient lives only while the backward writes it, and is reduced into the
    /// accumulator at the end of its last phase (stages 2-3, and every stage with 2-byte weights).
    pub fn grad_spans(&self) -> bool {
        matches!(self.zero, ZeroStage::Zero2 | ZeroStage::Zero3) || self.is_half()
    }

    /// The gradient accumulator holds this rank's shard (stages 2-3), not the whole unit.
    pub fn grad_acc_sharded(&self) -> bool {
        matches!(self.zero, ZeroStage::Zero2 | ZeroStage::Zero3)
    }

    /// The optimizer state (and master weights) hold this rank's shard (stages 1-3).
    pub fn optimizer_sharded(&self) -> bool {
        self.zero != ZeroStage::Zero0
    }

    /// Updated shards are all-gathered back into the whole weights (stages 1-2).
    pub fn gathers_after_update(&self) -> bool {
        matches!(self.zero, ZeroStage::Zero1 | ZeroStage::Zero2)
    }
}

/// Elements of one rank's shard of `unit` in a world of `world` ranks.
pub fn shard_numel(unit: &Unit, world: u32) -> u64 {
    unit.padded_numel / u64::from(world.max(1))
}

/// The rule for splitting: every rank must own at least one real (not padding) element of
/// every unit, so a world may not be larger than the smallest unit.
pub fn check_world(units: &[Unit], world: u32, zero: ZeroStage) -> Result<(), PlanError> {
    if zero == ZeroStage::Zero0 {
        return Ok(());
    }
    let smallest = units
        .iter()
        .min_by_key(|u| u.numel)
        .expect("a model has units");
    if u64::from(world) > smallest.numel {
        return Err(PlanError::Invalid {
            field: "dp".into(),
            reason: format!(
                "{world} ranks cannot split unit '{}' of {} elements: ZeRO stage {} needs at \
                 least one element per rank; use at most {} ranks (--ranks, --gpus)",
                smallest.name, smallest.numel, zero as u8, smallest.numel
            ),
        });
    }
    Ok(())
}

/// The phases in which the backward writes `kind`'s gradient: `(first, last)`. The embedding's
/// gradient is written by the head too when the output projection is tied to it.
pub fn grad_span(model: &ModelShape, kind: UnitKind) -> (Phase, Phase) {
    match kind {
        UnitKind::Embed if model.tied_embeddings => (Phase::Head, Phase::EmbedBackward),
        UnitKind::Embed => (Phase::EmbedBackward, Phase::EmbedBackward),
        UnitKind::Block(l) => (Phase::Backward(l), Phase::Backward(l)),
        UnitKind::Head => (Phase::Head, Phase::Head),
    }
}

/// Whether the units' gradients are written in 2 bytes directly (no fp32 span): every unit of
/// a model of 2-byte units (`ActPolicy`'s `bf16_units`), its vectors through the fp32
/// `grads.<u>.vectors`. At stages 0-1 the backward writes the whole accumulator
/// `grads.shard.<u>`, reduced once after the micro-steps; at 2-3 a 2-byte span `grads.<u>`,
/// reduce-scattered into the accumulator at the end of its last phase as the fp32 spans are.
pub fn direct_grads(policy: ActPolicy) -> bool {
    policy.bf16_units
}

/// The optimizer-state keys of one unit for `optimizer` (AdamW m, v; SGD momentum).
pub fn optimizer_keys(optimizer: Optimizer, unit: UnitKind) -> Vec<Key> {
    match optimizer {
        Optimizer::AdamW | Optimizer::AdamW8bit => vec![Key::OptM(unit), Key::OptV(unit)],
        Optimizer::Sgd => vec![Key::OptMomentum(unit)],
    }
}

/// The model-state buffers (weights, gradients, optimizer state) of one rank under `rule`, and
/// the gathers, for `units` padded for `rule.world` ranks (see [`StateRule`] for what is where).
/// Master weights `master.<u>` are fp32 optimizer state: 2 + 2 + 4 + 8 = 16 bytes per parameter
/// at stage 0 with bf16/fp16.
pub fn state_buffers(
    model: &ModelShape,
    units: &[Unit],
    rule: StateRule,
    policy: ActPolicy,
) -> Vec<Buffer> {
    let w = rule.elem_bytes;
    let dev = |key: Key, category: Category, bytes: u64, lifetime: Lifetime| {
        Buffer::keyed(key, category, Device::Gpu, bytes, lifetime)
    };
    let opt_device = if rule.optimizer_on_host {
        Device::Host
    } else {
        Device::Gpu
    };
    let persistent = Lifetime::Persistent;
    let mut out = Vec::new();
    for unit in units {
        let (full, shard) = (unit.padded_numel, shard_numel(unit, rule.world));
        let u = unit.kind;
        if rule.params_sharded() {
            out.push(dev(
                Key::ParamsShard(u),
                Category::Params,
                w * shard,
                persistent,
            ));
        } else {
            out.push(dev(Key::Params(u), Category::Params, w * full, persistent));
        }
        if rule.grad_spans() {
            let (born, dies) = grad_span(model, u);
            let span = Lifetime::Span { born, dies };
            match direct_grads(policy) {
                true if rule.grad_acc_sharded() => {
                    out.push(dev(Key::Grads(u), Category::Grads, w * full, span))
                }
                true => {}
                false => out.push(dev(Key::Grads(u), Category::Grads, 4 * full, span)),
            }
            let vectors = unit.vector_numel();
            if direct_grads(policy) && vectors > 0 {
                out.push(dev(Key::GradVectors(u), Category::Grads, 4 * vectors, span));
            }
            let acc = if rule.grad_acc_sharded() { shard } else { full };
            out.push(dev(
                Key::GradsShard(u),
                Category::Grads,
                w * acc,
                persistent,
            ));
        } else {
            // Persistent: accumulation adds into them across micro-steps.
            out.push(dev(Key::Grads(u), Category::Grads, 4 * full, persistent));
        }
        let opt_numel = if rule.optimizer_sharded() {
            shard
        } else {
            full
        };
        let mut keys = optimizer_keys(rule.optimizer, u);
        if rule.is_half() {
            keys.insert(0, Key::Master(u));
        }
        for key in keys {
            let bytes = 4 * opt_numel;
            out.push(Buffer::keyed(
                key,
                Category::Optimizer,
                opt_device,
                bytes,
                persistent,
            ));
        }
    }
    if rule.gathers() {
        for g in gathers(model, units, policy, rule.params_sharded()) {
            let span = Lifetime::Span {
                born: g.born,
                dies: g.dies,
            };
            out.push(dev(g.key, Category::Other, g.bytes(&units[g.unit]), span));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param_units;
    use plan::presets;

    #[test]
    fn a_world_larger_than_the_smallest_unit_is_refused() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        let units = param_units(&model, 1).unwrap();
        let smallest = units.iter().map(|u| u.numel).min().unwrap() as u32;
        assert!(check_world(&units, smallest, ZeroStage::Zero3).is_ok());
        let err = check_world(&units, smallest + 1, ZeroStage::Zero1).unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        assert!(check_world(&units, smallest + 1, ZeroStage::Zero0).is_ok());
    }
}
