//! The forward-only plan: a model's weights and one forward pass's activations, no gradient,
//! optimizer or backward bytes. The engine builds its `Runner` from it (export, logits, text
//! generation without a trainer); the inference engine extends it with a KV cache.
//!
//! Every block's tensors live in its own `Forward(l)` only, and a block's output until the next
//! block has read it, so consecutive blocks reuse the same bytes: the activation peak is about
//! one block's worth, against the training plan's L blocks kept for the backward. Keys are the
//! training plan's (`Key::Act(l, t)`, `Key::BlockOut(l)`, ...), so the engine's forward code runs
//! unchanged on either plan.
//!
//! Example: `forward_plan(&gpt2_124m, &ForwardSetup { batch: 1, seq: 64, attention: Flash })`
//! holds 124,439,808 × 4 bytes of weights and no `grads.*`.

use super::acts::{ActPolicy, ActShape, BlockDims, BlockTensor, CLASSIFIER_CHUNK_ROWS};
use super::key::Key;
use super::units::{check_buildable, param_units};
use plan::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use plan::setup::{Attention, Recompute};
use plan::{ModelShape, PlanError};

/// What a forward-only pass is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardSetup {
    /// Rows of the largest pass.
    pub batch: u64,
    /// Tokens per row of the largest pass.
    pub seq: u64,
    pub attention: Attention,
}

impl ForwardSetup {
    /// The activation policy of a pass that keeps nothing for a backward (fp32).
    pub fn policy(&self) -> ActPolicy {
        ActPolicy {
            recompute: Recompute::None,
            attention: self.attention,
            bf16_matmul_inputs: false,
            seq_shards: 1,
            bf16_in_place: false,
            bf16_units: false,
        }
    }
}

fn buffer(key: Key, category: Category, numel: u64, lifetime: Lifetime) -> Buffer {
    Buffer::keyed(key, category, Device::Gpu, 4 * numel, lifetime)
}

/// Every buffer of a forward-only model of `model` under `setup`: fp32 weights (one rank),
/// the token batch, each block's tensors for its own phase, the final norm and the classifier's
/// chunk of logits.
pub fn forward_plan(model: &ModelShape, setup: &ForwardSetup) -> Result<MemoryPlan, PlanError> {
    check_buildable(model)?;
    if setup.batch == 0 || setup.seq == 0 {
        return Err(PlanError::Invalid {
            field: "--batch".into(),
            reason: "batch and sequence must be positive".into(),
        });
    }
    plan::validate::check_positions(model, setup.seq)?;
    let mut plan = MemoryPlan::new(model.n_layers);
    for unit in param_units(model, 1)? {
        let key = Key::Params(unit.kind);
        let weights = buffer(
            key,
            Category::Params,
            unit.padded_numel,
            Lifetime::Persistent,
        );
        plan.push(weights);
    }
    let shape = ActShape {
        batch: setup.batch,
        seq: setup.seq,
    };
    let d = BlockDims::new(model, shape);
    let act = Category::Activations;
    let span = |born, dies| Lifetime::Span { born, dies };
    plan.push(buffer(Key::Tokens, act, d.n, Lifetime::Persistent));
    let into_first = span(Phase::Embed, Phase::Forward(0));
    plan.push(buffer(Key::Encoded, act, d.n * d.c, into_first));
    for layer in 0..model.n_layers {
        let own = span(Phase::Forward(layer), Phase::Forward(layer));
        let dims = BlockDims::layer(model, shape, layer);
        for t in BlockTensor::ALL {
            if let Some(numel) = dims.numel(t, setup.attention) {
                plan.push(buffer(Key::Act(layer, t), act, numel, own));
            }
        }
        let read_by = if layer + 1 == model.n_layers {
            Phase::Head
        } else {
            Phase::Forward(layer + 1)
        };
        let out = span(Phase::Forward(layer), read_by);
        plan.push(buffer(Key::BlockOut(layer), act, d.n * d.c, out));
    }
    let last = Phase::Forward(model.n_layers - 1);
    let moe = super::acts::moe_scratch(
        &d,
        setup.policy(),
        span(Phase::Forward(0), last),
        span(Phase::Embed, last),
    );
    moe.into_iter().for_each(|b| plan.push(b));
    let rows = span(Phase::Forward(0), last);
    super::acts::mla_scratch(&d, rows)
        .into_iter()
        .for_each(|b| plan.push(b));
    let head = span(Phase::Head, Phase::Head);
    plan.push(buffer(Key::Lnf, act, d.n * d.c, head));
    plan.push(buffer(Key::LnfRstd, act, d.n, head));
    if d.has_mean {
        plan.push(buffer(Key::LnfMean, act, d.n, head));
    }
    let chunk = CLASSIFIER_CHUNK_ROWS.min(d.n) * model.vocab;
    plan.push(buffer(Key::Classifier, Category::Other, chunk, head));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign_offsets;
    use plan::presets;

    #[test]
    fn a_forward_plan_holds_weights_and_about_one_block_of_activations() {
        let model = presets::by_name("gpt2-124m").unwrap();
        let setup = ForwardSetup {
            batch: 1,
            seq: 64,
            attention: Attention::Flash,
        };
        let plan = forward_plan(&model, &setup).unwrap();
        let peaks = plan.category_peaks(Device::Gpu);
        assert_eq!(peaks[Category::Params as usize], 4 * 124_439_808);
        assert_eq!(peaks[Category::Grads as usize], 0);
        assert_eq!(peaks[Category::Optimizer as usize], 0);
        let d = BlockDims::new(&model, ActShape { batch: 1, seq: 64 });
        let block: u64 = BlockTensor::ALL
            .iter()
            .filter_map(|&t| d.numel(t, Attention::Flash))
            .sum();
        // One block's tensors, its input and its output, and the token ids, at most.
        let most = 4 * (block + 2 * d.n * d.c + d.n);
        assert!(peaks[Category::Activations as usize] <= most);
        let slab = assign_offsets(&plan, Device::Gpu).slab_bytes;
        assert_eq!(
            slab,
            plan.peak_bytes(Device::Gpu),
            "the slab packs to the peak"
        );
        let long = ForwardSetup { seq: 4096, ..setup };
        assert!(forward_plan(&model, &long).is_err());
    }
}
