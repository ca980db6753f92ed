//! The gathers of one micro-step: which unit is copied into which buffer for the kernels, in
//! what form ([`Holds`]), born when, used when (see the schedule in `shards`).
//!
//! Example: `gathers(&gpt2_tiny, &units, ActPolicy::PLAIN, true)` lists `gather.fwd.h.0` born
//! in `Embed`, dying in `Forward(0)`, and `gather.bwd.h.1` born in `Head`, dying in
//! `Backward(1)`; under `ActPolicy`'s `bf16_units` below stage 3 it lists only the vectors
//! (`gather.fwd.h.0.vectors`, ...).

use crate::acts::ActPolicy;
use crate::key::Key;
use crate::units::{Unit, UnitKind};
use plan::buffer::Phase;
use plan::ModelShape;

/// What a gather buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// The whole unit widened to fp32 (4 bytes an element): fp32 at stage 3, fp16 at every
    /// stage (from its working copy below stage 3).
    Widened,
    /// The 2-byte shards' bits as gathered (2 bytes an element): 2-byte units at stage 3.
    Bits,
    /// The unit's vectors (`Unit::vectors`) widened to fp32, one after another: 2-byte units,
    /// from the working copy below stage 3, or from the bits gathered into the buffer named.
    Vectors(Option<Key>),
}

/// One gather: unit `unit` (index into the units) into buffer `key`, live from `born` to
/// `dies`, read by the kernels in the phases `used_from ..= dies`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub unit: usize,
    pub key: Key,
    pub born: Phase,
    pub used_from: Phase,
    pub dies: Phase,
    pub holds: Holds,
}

impl Gather {
    /// Bytes of the buffer for `unit`.
    pub fn bytes(&self, unit: &Unit) -> u64 {
        match self.holds {
            Holds::Widened => 4 * unit.padded_numel,
            Holds::Bits => 2 * unit.padded_numel,
            Holds::Vectors(_) => 4 * unit.vector_numel(),
        }
    }
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

/// Every gather of one micro-step for the model's `units` (all of them, or a LoRA model's
/// adapter units, one per block: those have no embedding or head gathers), in the order they
/// are filled. `prefetch` (stage 3): each is born one phase before its first use.
///
/// Under `ActPolicy`'s `bf16_units` no unit is ever widened: at stage 3 each slot gathers the
/// unit's bits and, for a unit with vectors, widens those beside them (`gather.*.vectors`, born
/// with the bits); below stage 3 only the vectors, from the working copy.
pub fn gathers(
    model: &ModelShape,
    units: &[Unit],
    policy: ActPolicy,
    prefetch: bool,
) -> Vec<Gather> {
    let n = model.n_layers;
    let index = |kind: UnitKind| units.iter().position(|u| u.kind == kind);
    let mut out = Vec::new();
    // One slot: unit `u` read by the kernels from `used_from` to `dies` through `key`
    // (`vectors` the key of its vectors, `None` for a slot that reads only 2-byte weights).
    let mut slot = |u: usize, key: Key, vectors: Option<Key>, used_from: Phase, dies: Phase| {
        let born = match prefetch {
            true => previous(used_from, n),
            false => used_from,
        };
        let gather = |key, holds| Gather {
            unit: u,
            key,
            born,
            used_from,
            dies,
            holds,
        };
        if !policy.bf16_units {
            return out.push(gather(key, Holds::Widened));
        }
        if prefetch {
            out.push(gather(key, Holds::Bits));
        }
        let from = prefetch.then_some(key);
        if let Some(v) = vectors.filter(|_| units[u].vector_numel() > 0) {
            out.push(gather(v, Holds::Vectors(from)));
        }
    };
    if let Some(u) = index(UnitKind::Embed) {
        let (key, vectors) = (
            Key::GatherFwd(UnitKind::Embed),
            Key::VectorsFwd(UnitKind::Embed),
        );
        slot(u, key, Some(vectors), Phase::Embed, Phase::Embed);
    }
    for l in 0..n {
        if let Some(u) = index(UnitKind::Block(l)) {
            let kind = UnitKind::Block(l);
            let f = Phase::Forward(l);
            slot(u, Key::GatherFwd(kind), Some(Key::VectorsFwd(kind)), f, f);
        }
    }
    if let Some(u) = index(UnitKind::Head) {
        let (key, vectors) = (
            Key::GatherFwd(UnitKind::Head),
            Key::VectorsFwd(UnitKind::Head),
        );
        slot(u, key, Some(vectors), Phase::Head, Phase::Head);
    }
    // The head reads the tied token embedding (no vectors: the table alone).
    if let Some(u) = index(UnitKind::Embed).filter(|_| model.tied_embeddings) {
        slot(u, Key::GatherHeadEmbed, None, Phase::Head, Phase::Head);
    }
    for l in (0..n).rev() {
        // A segment's recompute runs in the backward of its last block and reads every block
        // of the segment: gather there once, keep until the block's own backward.
        let last = policy.segment(n, l).map_or(l, |(_, last)| last);
        let (used, dies) = (Phase::Backward(last), Phase::Backward(l));
        if let Some(u) = index(UnitKind::Block(l)) {
            slot(u, Key::GatherBwd(l), Some(Key::VectorsBwd(l)), used, dies);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param_units;
    use plan::presets;
    use plan::setup::Recompute;

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

    /// 2-byte units: stage 3 gathers every unit's bits with its vectors beside them (the
    /// embedding and the tied head's table have none); below it only the vectors, born where used.
    #[test]
    fn two_byte_units_gather_bits_and_widen_only_their_vectors() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        let units = param_units(&model, 1).unwrap();
        let policy = ActPolicy {
            bf16_units: true,
            bf16_matmul_inputs: true,
            ..ActPolicy::PLAIN
        };
        let names = |g: &[Gather]| -> Vec<String> { g.iter().map(|g| g.key.to_string()).collect() };
        let stage3 = gathers(&model, &units, policy, true);
        let n = names(&stage3);
        assert!(
            n.contains(&"gather.fwd.embed".into())
                && !n.contains(&"gather.fwd.embed.vectors".into())
        );
        let v0 = stage3
            .iter()
            .find(|g| g.key == Key::VectorsFwd(UnitKind::Block(0)))
            .unwrap();
        assert_eq!(
            v0.holds,
            Holds::Vectors(Some(Key::GatherFwd(UnitKind::Block(0))))
        );
        assert!(stage3.iter().all(|g| g.holds != Holds::Widened));
        let below = gathers(&model, &units, policy, false);
        assert!(below
            .iter()
            .all(|g| matches!(g.holds, Holds::Vectors(None))));
        assert!(below.iter().all(|g| g.born == g.used_from));
        let block = units.iter().find(|u| u.kind == UnitKind::Block(0)).unwrap();
        // GPT-2's block vectors: two norms' weight and bias and four biases.
        let c = model.d_model;
        assert_eq!(block.vector_numel(), 4 * c + 3 * c + c + 4 * c + c);
        assert_eq!(below[1].bytes(block), 4 * block.vector_numel());
    }
}
