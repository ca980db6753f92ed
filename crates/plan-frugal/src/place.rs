//! One rank's plan by where it sits: its tensor-parallel rank (its share of every block's heads,
//! MLP and of the vocabulary, [`super::tp`]) and its pipeline stage (its layers, the embedding
//! on the first stage, the head on the last, [`super::pp`]). The plan of a rank is the single-rank
//! plan of that share of the model, plus what only parallel runs hold: the vocab-parallel
//! loss's statistics, the pipeline's exchange buffer and its stash of in-flight micro-batches.
//!
//! Example: `training_plan_of(&gpt2, &setup, 0, 1)` is tensor-parallel rank 0 of stage 1.

use super::pp::{self, Stage};
use super::{acts, adapters, param_units, shards, tp, widen_classifier_chunk};
use super::{ActPolicy, ActShape, Key, StateRule, Unit, CLASSIFIER_CHUNK_ROWS};
use plan::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use plan::{ModelShape, PlanError, TrainSetup};

/// The stage `index` of `setup`'s pipeline (the whole model without one).
pub fn stage_of(model: &ModelShape, setup: &TrainSetup, index: u32) -> Stage {
    match setup.pp > 1 {
        true => Stage::of(model.n_layers, setup.pp, index),
        false => Stage::whole(model.n_layers),
    }
}

/// The units tensor-parallel rank `tp_rank` of the first stage updates.
pub fn rank_units(
    model: &ModelShape,
    setup: &TrainSetup,
    tp_rank: u32,
) -> Result<Vec<Unit>, PlanError> {
    stage_units(model, setup, tp_rank, stage_of(model, setup, 0))
}

/// The units a rank updates: its share ([`tp::rank_shape`]) of its stage's units, padded for
/// the data-parallel group; under LoRA the adapters.
pub fn stage_units(
    model: &ModelShape,
    setup: &TrainSetup,
    tp_rank: u32,
    stage: Stage,
) -> Result<Vec<Unit>, PlanError> {
    if let Some(lora) = &setup.lora {
        return adapters::adapter_units(model, lora, setup.dp);
    }
    let staged = pp::shape(model, stage);
    let units = match setup.tp > 1 {
        true => tp::units(&staged, setup.tp, tp_rank, setup.dp)?,
        false => param_units(&staged, setup.dp)?,
    };
    let tied = model.tied_embeddings;
    Ok(units
        .into_iter()
        .filter(|u| stage.holds(u.kind, tied))
        .collect())
}

/// [`training_plan_of`] of tensor-parallel rank `tp_rank` on the stage with the largest peak
/// (the first stage without a pipeline).
pub fn training_plan_rank(
    whole: &ModelShape,
    setup: &TrainSetup,
    tp_rank: u32,
) -> Result<MemoryPlan, PlanError> {
    let mut plans = stage_plans(whole, setup, tp_rank)?;
    let busiest = (0..plans.len())
        .max_by_key(|&i| (plans[i].1.peak_bytes(Device::Gpu), std::cmp::Reverse(i)))
        .unwrap_or(0);
    Ok(plans.swap_remove(busiest).1)
}

/// Every stage's plan for tensor-parallel rank `tp_rank`, in stage order.
pub fn stage_plans(
    whole: &ModelShape,
    setup: &TrainSetup,
    tp_rank: u32,
) -> Result<Vec<(Stage, MemoryPlan)>, PlanError> {
    (0..setup.pp.max(1))
        .map(|s| {
            let stage = stage_of(whole, setup, s);
            Ok((stage, training_plan_of(whole, setup, tp_rank, s)?))
        })
        .collect()
}

/// Every buffer one rank allocates: tensor-parallel rank `tp_rank` of pipeline stage `stage`.
pub fn training_plan_of(
    whole: &ModelShape,
    setup: &TrainSetup,
    tp_rank: u32,
    stage: u32,
) -> Result<MemoryPlan, PlanError> {
    super::check_setup(whole, setup)?;
    let stage = stage_of(whole, setup, stage);
    let local = tp::rank_shape(&pp::shape(whole, stage), setup.tp.max(1), tp_rank);
    let model = &local;
    let mut plan = MemoryPlan::new(model.n_layers);
    let units = stage_units(whole, setup, tp_rank, stage)?;
    shards::check_world(&units, setup.dp, setup.zero)?;
    let policy = ActPolicy::of(setup);
    let rule = StateRule::of(setup);
    for buffer in shards::state_buffers(model, &units, rule, policy) {
        plan.push(buffer);
    }
    let shape = ActShape {
        batch: setup.micro_batch,
        seq: setup.seq,
    };
    for buffer in acts::activation_buffers(model, shape, policy) {
        if !buffer.key.is_some_and(|k| pp::not_held(k, stage)) {
            plan.push(buffer);
        }
    }
    if let Some(lora) = &setup.lora {
        let dims = acts::BlockDims::new(model, shape);
        for buffer in adapters::lora_buffers(model, lora, &dims, policy)? {
            plan.push(buffer);
        }
    }
    let rows = setup.micro_batch * setup.seq;
    let head = Lifetime::Span {
        born: Phase::Head,
        dies: Phase::Head,
    };
    if setup.tp > 1 && stage.is_last() {
        // Max, sum of exponentials and target logit of each row of a chunk.
        let stats = 3 * 4 * rows.min(CLASSIFIER_CHUNK_ROWS);
        let key = Key::Work(super::key::Work::TpStats);
        plan.push(Buffer::keyed(
            key,
            Category::Other,
            Device::Gpu,
            stats,
            head,
        ));
    } else if setup.tp == 1 {
        // Not under tensor parallelism: every rank's chunk must have the same rows (their
        // reductions pair up), and the ranks' vocabulary slices differ.
        widen_classifier_chunk(&mut plan, acts::classifier_row_bytes(model, policy), rows);
    }
    if setup.tp > 1 && tp::kv_replicas(whole, setup.tp) > 1 {
        let kv = 2 * model.d_head * (model.d_model + 1);
        let life = Lifetime::Span {
            born: Phase::Backward(model.n_layers - 1),
            dies: Phase::Backward(0),
        };
        let key = Key::Work(super::key::Work::TpKv);
        plan.push(Buffer::keyed(
            key,
            Category::Other,
            Device::Gpu,
            4 * kv,
            life,
        ));
    }
    if setup.pp > 1 {
        // The boundary tensor: the residual stream's rows on this rank.
        let boundary = 4 * (rows / policy.seq_shards) * model.d_model;
        let key = Key::Work(super::key::Work::PpExchange);
        let exchange = Buffer::keyed(
            key,
            Category::Other,
            Device::Gpu,
            2 * boundary,
            Lifetime::Persistent,
        );
        let stash = pp::stash_buffers(&plan, stage.stash_slots(setup.grad_accum));
        plan.push(exchange);
        for buffer in stash {
            plan.push(buffer);
        }
    }
    Ok(plan)
}
