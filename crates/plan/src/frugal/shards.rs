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
//! per backward, never two. Prefetch: every gather is born one phase before its first use (the
//! next unit is gathered while the current one computes), which costs one more unit's bytes.
//! Gathered units count as `Other` (the seed's "gathered working set"), so `params_bytes` is
//! exactly the shard: model state is (4 + 4 + 8)·Ψ/N = 16Ψ/N bytes per rank for fp32 AdamW.
//!
//! Gradient accumulation: stages 0 and 1 accumulate full gradients locally over the K
//! micro-steps and reduce once at the end (all-reduce / reduce-scatter: 2Ψ of traffic per
//! step, 4Ψ of persistent gradient memory). Stages 2 and 3 reduce-scatter each unit's gradient
//! at the end of the phase that finishes it, every micro-step, and add the result into the
//! persistent shard `grads.shard.<u>` (4Ψ/N): K reduce-scatters per step (K·Ψ of traffic) but
//! never more than one unit's full gradient live (two with tied embeddings: the embedding's
//! lives from `Head` to `EmbedBackward`).
//!
//! Example: `gathers(&gpt2_tiny, ActPolicy::PLAIN)` lists `gather.fwd.h.0` born in `Embed`,
//! dying in `Forward(0)`, and `gather.bwd.h.1` born in `Head`, dying in `Backward(1)`.

use super::acts::ActPolicy;
use super::units::{Unit, UnitKind};
use crate::buffer::{Buffer, Category, Device, Lifetime, Phase};
use crate::setup::{Optimizer, ZeroStage};
use crate::{ModelShape, PlanError};

/// Name of a unit's full working weights (stages 0-2).
pub fn params_name(unit: &str) -> String {
    format!("params.{unit}")
}

/// Name of a rank's shard of a unit's weights (stage 3).
pub fn params_shard_name(unit: &str) -> String {
    format!("params.shard.{unit}")
}

/// Name of a unit's full gradient (persistent at stages 0-1, a span at 2-3).
pub fn grads_name(unit: &str) -> String {
    format!("grads.{unit}")
}

/// Name of a rank's accumulated gradient shard (stages 2-3).
pub fn grads_shard_name(unit: &str) -> String {
    format!("grads.shard.{unit}")
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

/// One stage-3 gather: unit `unit` (index into the units) all-gathered into buffer `name`,
/// live from `born` to `dies`, read by the kernels in the phases `used_from ..= dies`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub unit: usize,
    pub name: String,
    pub born: Phase,
    pub used_from: Phase,
    pub dies: Phase,
}

/// The phase before `phase` on the training timeline (the first phase has none before it).
fn previous(phase: Phase, n_layers: u32) -> Phase {
    match phase {
        Phase::Embed | Phase::Forward(0) => Phase::Embed,
        Phase::Forward(l) => Phase::Forward(l - 1),
        Phase::Head => Phase::Forward(n_layers - 1),
        Phase::Backward(l) if l == n_layers - 1 => Phase::Head,
        Phase::Backward(l) => Phase::Backward(l + 1),
        Phase::EmbedBackward => Phase::Backward(0),
        Phase::Optimizer => Phase::EmbedBackward,
    }
}

/// Every stage-3 gather of one micro-step, in the order they are born.
pub fn gathers(model: &ModelShape, policy: ActPolicy) -> Vec<Gather> {
    let n = model.n_layers;
    let head = n as usize + 1;
    let gather = |unit: usize, name: String, used_from: Phase, dies: Phase| Gather {
        unit,
        name,
        born: previous(used_from, n),
        used_from,
        dies,
    };
    let mut out = vec![gather(
        0,
        "gather.fwd.embed".into(),
        Phase::Embed,
        Phase::Embed,
    )];
    for l in 0..n {
        let f = Phase::Forward(l);
        out.push(gather(1 + l as usize, format!("gather.fwd.h.{l}"), f, f));
    }
    out.push(gather(
        head,
        "gather.fwd.head".into(),
        Phase::Head,
        Phase::Head,
    ));
    if model.tied_embeddings {
        out.push(gather(
            0,
            "gather.head.embed".into(),
            Phase::Head,
            Phase::Head,
        ));
    }
    for l in (0..n).rev() {
        // A segment's recompute runs in the backward of its last block and reads every block
        // of the segment: gather there once, keep until the block's own backward.
        let last = policy.segment(n, l).map_or(l, |(_, last)| last);
        let (used, dies) = (Phase::Backward(last), Phase::Backward(l));
        out.push(gather(
            1 + l as usize,
            format!("gather.bwd.h.{l}"),
            used,
            dies,
        ));
    }
    out
}

/// Name of a unit's fp32 master weights (2-byte precisions: the optimizer's copy).
pub fn master_name(unit: &str) -> String {
    format!("master.{unit}")
}

/// How model state is stored: element bytes of weights and gradients (4 for fp32, 2 for bf16
/// and fp16, which add fp32 master weights), and whether the optimizer state lives on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateFormat {
    pub elem_bytes: u64,
    pub optimizer_on_host: bool,
}

impl StateFormat {
    pub const FP32: StateFormat = StateFormat {
        elem_bytes: 4,
        optimizer_on_host: false,
    };

    /// Whether weights and gradients are 2-byte (with fp32 master weights).
    pub fn is_half(&self) -> bool {
        self.elem_bytes == 2
    }
}

/// The model-state buffers (weights, gradients, optimizer state) of one rank at `zero`, and the
/// stage-3 gathers, for `units` padded for `world` ranks.
///
/// With 2-byte weights (`format.is_half()`) at any stage, the kernels read fp32: every unit is
/// widened into the fp32 `gather.*` buffers on the stage-3 schedule (from the 2-byte full copy
/// at stages 0-2, all-gathered from the 2-byte shard at stage 3), the backward writes fp32
/// `grads.<u>` spans as at stage 2, and each span ends added (rounded once) into the 2-byte
/// accumulator `grads.shard.<u>` (full at stages 0-1, the shard at 2-3). Master weights
/// `master.<u>` are fp32 optimizer state: 2 + 2 + 4 + 8 = 16 bytes per parameter at stage 0.
pub fn state_buffers(
    model: &ModelShape,
    units: &[Unit],
    world: u32,
    zero: ZeroStage,
    optimizer: Optimizer,
    policy: ActPolicy,
    format: StateFormat,
) -> Vec<Buffer> {
    let w = format.elem_bytes;
    let half = format.is_half();
    let buffer = |name: String, category: Category, bytes: u64, lifetime: Lifetime| Buffer {
        name,
        category,
        device: Device::Gpu,
        bytes,
        lifetime,
    };
    let opt_device = if format.optimizer_on_host {
        Device::Host
    } else {
        Device::Gpu
    };
    let persistent = Lifetime::Persistent;
    let mut out = Vec::new();
    for unit in units {
        let (full, shard) = (unit.padded_numel, shard_numel(unit, world));
        let name = &unit.name;
        if zero == ZeroStage::Zero3 {
            out.push(buffer(
                params_shard_name(name),
                Category::Params,
                w * shard,
                persistent,
            ));
        } else {
            out.push(buffer(
                params_name(name),
                Category::Params,
                w * full,
                persistent,
            ));
        }
        if half {
            let (born, dies) = grad_span(model, unit.kind);
            let span = Lifetime::Span { born, dies };
            out.push(buffer(grads_name(name), Category::Grads, 4 * full, span));
            let acc = if matches!(zero, ZeroStage::Zero0 | ZeroStage::Zero1) {
                full
            } else {
                shard
            };
            let acc = buffer(grads_shard_name(name), Category::Grads, w * acc, persistent);
            out.push(acc);
        } else if matches!(zero, ZeroStage::Zero0 | ZeroStage::Zero1) {
            // Persistent: accumulation adds into them across micro-steps.
            out.push(buffer(
                grads_name(name),
                Category::Grads,
                4 * full,
                persistent,
            ));
        } else {
            let (born, dies) = grad_span(model, unit.kind);
            let span = Lifetime::Span { born, dies };
            out.push(buffer(grads_name(name), Category::Grads, 4 * full, span));
            out.push(buffer(
                grads_shard_name(name),
                Category::Grads,
                4 * shard,
                persistent,
            ));
        }
        let opt_numel = if zero == ZeroStage::Zero0 {
            full
        } else {
            shard
        };
        let mut opt_names = super::optimizer_buffer_names(optimizer, name);
        if half {
            opt_names.insert(0, master_name(name));
        }
        for opt in opt_names {
            let mut b = buffer(opt, Category::Optimizer, 4 * opt_numel, persistent);
            b.device = opt_device;
            out.push(b);
        }
    }
    if zero == ZeroStage::Zero3 || half {
        for g in gathers(model, policy) {
            let span = Lifetime::Span {
                born: g.born,
                dies: g.dies,
            };
            out.push(buffer(
                g.name,
                Category::Other,
                4 * units[g.unit].padded_numel,
                span,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frugal::param_units;
    use crate::presets;
    use crate::setup::Recompute;

    #[test]
    fn recompute_gathers_a_segment_once_in_its_last_blocks_backward() {
        let mut model = presets::by_name("gpt2-tiny").unwrap();
        model.n_layers = 4;
        let policy = ActPolicy {
            recompute: Recompute::Every(2),
            ..ActPolicy::PLAIN
        };
        let g = gathers(&model, policy);
        let find = |name: &str| g.iter().find(|g| g.name == name).unwrap().clone();
        let b0 = find("gather.bwd.h.0");
        assert_eq!(
            (b0.born, b0.used_from, b0.dies),
            (Phase::Backward(2), Phase::Backward(1), Phase::Backward(0))
        );
        let b3 = find("gather.bwd.h.3");
        assert_eq!((b3.born, b3.dies), (Phase::Head, Phase::Backward(3)));
        assert_eq!(g.iter().filter(|g| g.name.contains("bwd")).count(), 4);
        let f0 = find("gather.fwd.h.0");
        assert_eq!((f0.born, f0.dies), (Phase::Embed, Phase::Forward(0)));
    }

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
