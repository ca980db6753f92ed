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
//! also needs the token embedding: `gather.head.embed` (under `ActPolicy::bf16_head` only at
//! stage 3, as the 2-byte bits: below it the head reads the working copy). The embedding's backward reads no
//! weights, so it has no backward gather. Under a segment recompute policy the backward of a
//! segment's last block re-runs the whole segment's forward, so each block's backward gather is
//! born there and serves both the recompute and the block's own backward: one gather per unit
//! per backward, never two. Prefetch: at stage 3 every gather is born one phase before its first
//! use (the next unit is gathered while the current one computes), which costs one more unit's
//! bytes; below stage 3 (2-byte weights widened from the rank's own whole copy, no
//! communication to hide) a gather is born where it is first used.
//! Gathered units count as `Other` (the seed's "gathered working set"), so `params_bytes` is
//! exactly the shard: model state is (4 + 4 + 8)·Ψ/N = 16Ψ/N bytes per rank for fp32 AdamW.
//!
//! Under `ActPolicy::bf16_head` the tables (the embedding, an untied head: [`direct_grads`])
//! never exist in fp32: the embedding's forward reads the working copy (stage 3: the bits
//! gathered, `gather.fwd.embed` 2 bytes an element), and their gradients are written in 2
//! bytes directly — into the whole accumulator at stages 0-1 (reduced once at the end of the
//! step, as fp32's full gradients), into a 2-byte span at stages 2-3 — with an untied head's
//! final-norm vectors through `grads.head.vectors` (fp32, the head only).
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

use super::acts::ActPolicy;
use super::key::Key;
use super::units::{Unit, UnitKind};
use crate::buffer::{Buffer, Category, Device, Lifetime, Phase};
use crate::setup::{Optimizer, Precision, TrainSetup, ZeroStage};
use crate::{ModelShape, PlanError};

/// How a ZeRO stage, the weight precision and optimizer offload store one unit's model state:
/// the one rule the plan emits buffers from and the engine's `zero::Sharding` obeys.
///
/// | question | fp32 | bf16/fp16 |
/// |---|---|---|
/// | weights | `params.<u>` whole at 0-2, `params.shard.<u>` at 3 | the same, 2-byte |
/// | what the kernels read | `params.<u>`; stage 3 `gather.*` | fp32 `gather.*` at every stage; bf16 GEMMs the 2-byte `params.<u>` (stages 0-2) |
/// | full gradient | persistent at 0-1; a span at 2-3 | an fp32 span at every stage; bf16 tables ([`direct_grads`]): none at 0-1, a 2-byte span at 2-3 |
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
            optimizer_on_host: setup.offload == crate::setup::Offload::Optimizer,
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

    /// The kernels read fp32 copies gathered (and widened) on the stage-3 schedule: at stage 3,
    /// and at every stage with 2-byte weights.
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

/// Whether unit `kind`'s gradient is written in 2 bytes directly (no fp32 span): under
/// `ActPolicy::bf16_head`, the embedding and an untied head (its final-norm vectors through the
/// fp32 `grads.head.vectors`). At stages 0-1 the backward writes the whole accumulator
/// `grads.shard.<u>`, reduced once after the micro-steps; at 2-3 a 2-byte span `grads.<u>`,
/// reduce-scattered into the accumulator at the end of its last phase as the fp32 spans are.
pub fn direct_grads(policy: ActPolicy, units: &[Unit], kind: UnitKind) -> bool {
    policy.bf16_head
        && match kind {
            UnitKind::Embed => true,
            UnitKind::Head => head_vectors(units).is_some(),
            UnitKind::Block(_) => false,
        }
}

/// One stage-3 gather: unit `unit` (index into the units) all-gathered into buffer `key`,
/// live from `born` to `dies`, read by the kernels in the phases `used_from ..= dies`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub unit: usize,
    pub key: Key,
    pub born: Phase,
    pub used_from: Phase,
    pub dies: Phase,
    /// The 2-byte shards' bits as gathered, not widened to fp32 (2 bytes an element), at stage 3
    /// under `ActPolicy::bf16_head`: the output projection (the tied embedding, or the untied
    /// head unit) and the embedding for its forward.
    pub bits: bool,
}

/// Elements of the untied head unit before its output projection (the final norm's vectors),
/// which the bf16 head widens into `gather.head.vectors` for the fp32 norm kernels (from the
/// working copy below stage 3, from the unit's bits gather at stage 3).
pub fn head_vectors(units: &[Unit]) -> Option<u64> {
    let head = units.iter().find(|u| u.kind == UnitKind::Head)?;
    let lm = head.views.iter().find(|v| v.role == super::Role::LmHead)?;
    Some(lm.offset)
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
        Phase::Prefill | Phase::Decode => unreachable!("training gathers"),
    }
}

/// Every stage-3 gather of one micro-step for the model's `units` (all of them, or a LoRA
/// model's adapter units, one per block: those have no embedding or head gathers), in the order
/// they are born.
/// `prefetch` (stage 3): each is born one phase before its first use.
pub fn gathers(
    model: &ModelShape,
    units: &[Unit],
    policy: ActPolicy,
    prefetch: bool,
) -> Vec<Gather> {
    let n = model.n_layers;
    let index = |kind: UnitKind| units.iter().position(|u| u.kind == kind);
    let gather = |unit: usize, key: Key, used_from: Phase, dies: Phase| Gather {
        unit,
        key,
        born: match prefetch {
            true => previous(used_from, n),
            false => used_from,
        },
        used_from,
        dies,
        bits: false,
    };
    let mut out = Vec::new();
    if let Some(u) = index(UnitKind::Embed) {
        let embed = gather(
            u,
            Key::GatherFwd(UnitKind::Embed),
            Phase::Embed,
            Phase::Embed,
        );
        // The bf16 tables: the embedding reads its working copy, or at stage 3 its bits.
        match (policy.bf16_head, policy.bf16_in_place) {
            (false, _) => out.push(embed),
            (true, false) => out.push(Gather {
                bits: true,
                ..embed
            }),
            (true, true) => {}
        }
    }
    for l in 0..n {
        let f = Phase::Forward(l);
        if let Some(u) = index(UnitKind::Block(l)) {
            out.push(gather(u, Key::GatherFwd(UnitKind::Block(l)), f, f));
        }
    }
    if let Some(u) = index(UnitKind::Head) {
        let head = gather(u, Key::GatherFwd(UnitKind::Head), Phase::Head, Phase::Head);
        // The bf16 head on an untied projection: below stage 3 it reads the working copy, so
        // only the final norm's vectors are widened (`gather.head.vectors`); at stage 3 the
        // unit's 2-byte bits are gathered (its vectors widened beside them).
        let untied = policy.bf16_head && head_vectors(units).is_some();
        match (untied, policy.bf16_in_place) {
            (false, _) => out.push(head),
            (true, true) => out.push(Gather {
                key: Key::GatherHeadVectors,
                ..head
            }),
            (true, false) => out.push(Gather { bits: true, ..head }),
        }
    }
    // The bf16 head reads the tied embedding's 2-byte working copy in place, or at stage 3
    // (where no copy is whole, `bf16_in_place` is off) its 2-byte bits gathered.
    if let Some(u) = index(UnitKind::Embed).filter(|_| model.tied_embeddings) {
        let head = gather(u, Key::GatherHeadEmbed, Phase::Head, Phase::Head);
        match (policy.bf16_head, policy.bf16_in_place) {
            (false, _) => out.push(head),
            (true, false) => out.push(Gather { bits: true, ..head }),
            (true, true) => {}
        }
    }
    for l in (0..n).rev() {
        // A segment's recompute runs in the backward of its last block and reads every block
        // of the segment: gather there once, keep until the block's own backward.
        let last = policy.segment(n, l).map_or(l, |(_, last)| last);
        let (used, dies) = (Phase::Backward(last), Phase::Backward(l));
        if let Some(u) = index(UnitKind::Block(l)) {
            out.push(gather(u, Key::GatherBwd(l), used, dies));
        }
    }
    out
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
            match direct_grads(policy, units, u) {
                true if rule.grad_acc_sharded() => {
                    out.push(dev(Key::Grads(u), Category::Grads, w * full, span))
                }
                true => {}
                false => out.push(dev(Key::Grads(u), Category::Grads, 4 * full, span)),
            }
            if u == UnitKind::Head && direct_grads(policy, units, u) {
                let vectors = head_vectors(units).expect("an untied head");
                let head = Lifetime::Span {
                    born: Phase::Head,
                    dies: Phase::Head,
                };
                out.push(dev(
                    Key::GradHeadVectors,
                    Category::Grads,
                    4 * vectors,
                    head,
                ));
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
            let bytes = match (g.bits, g.key) {
                (_, Key::GatherHeadVectors) => 4 * head_vectors(units).expect("an untied head"),
                (true, _) => 2 * units[g.unit].padded_numel,
                (false, _) => 4 * units[g.unit].padded_numel,
            };
            out.push(dev(g.key, Category::Other, bytes, span));
            if let (true, Key::GatherFwd(UnitKind::Head)) = (g.bits, g.key) {
                let vectors = head_vectors(units).expect("an untied head");
                out.push(dev(
                    Key::GatherHeadVectors,
                    Category::Other,
                    4 * vectors,
                    span,
                ));
            }
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
        let units = param_units(&model, 1).unwrap();
        let g = gathers(&model, &units, policy, true);
        let find = |name: &str| {
            g.iter()
                .find(|g| g.key.to_string() == name)
                .unwrap()
                .clone()
        };
        let b0 = find("gather.bwd.h.0");
        assert_eq!(
            (b0.born, b0.used_from, b0.dies),
            (Phase::Backward(2), Phase::Backward(1), Phase::Backward(0))
        );
        let b3 = find("gather.bwd.h.3");
        assert_eq!((b3.born, b3.dies), (Phase::Head, Phase::Backward(3)));
        let backward = g.iter().filter(|g| matches!(g.key, Key::GatherBwd(_)));
        assert_eq!(backward.count(), 4);
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
