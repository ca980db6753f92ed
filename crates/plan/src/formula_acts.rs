//! The `formula` runtime's activation timeline: when each block's saved activations are born and
//! die under a recompute policy, the 1F1B pipeline's in-flight micro-batches, the head's logits
//! with the loss's fp32 upcast, backward workspaces, autocast weight copies and the QLoRA
//! dequantization buffer.
//!
//! Recompute `every:K` keeps the input of the first block of each K-block segment; in backward
//! the segment is recomputed at once, so its K blocks' activations are live together and each dies
//! after its own backward. `full` is `every:1`, `sqrt` is `every:round(√L)`. Not here: how many
//! bytes a block saves ([`crate::acts`]). Example: called by `formula::training_plan`.

use crate::acts::{act_bytes, LayerActs};
use crate::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use crate::formula::Policy;
use crate::recompute::{Kept, RecomputePlan};
use crate::setup::TrainSetup;
use crate::{lora, ModelShape};

/// What the activation timeline needs to know about a pipeline stage.
#[derive(Clone, Copy, Debug)]
pub struct StageView {
    pub first_layer: u32,
    pub n_layers: u32,
    pub has_embed: bool,
    pub has_head: bool,
    pub in_flight: u64,
    /// 16-bit bytes of the largest linear weight when the frozen base is quantized (else 0).
    pub largest_linear_bytes: u64,
}

fn push(plan: &mut MemoryPlan, name: String, category: Category, bytes: u64, life: Lifetime) {
    if bytes > 0 {
        plan.push(Buffer::named(name, category, Device::Gpu, bytes, life));
    }
}

fn span(born: Phase, dies: Phase) -> Lifetime {
    Lifetime::Span { born, dies }
}

/// LoRA's extra saved tensor per adapted linear: the rank-sized output of A, for B's gradient.
fn lora_bytes(model: &ModelShape, setup: &TrainSetup, layer_idx: u32) -> u64 {
    let Some(l) = &setup.lora else { return 0 };
    let tokens = setup.seq * setup.micro_batch;
    let active = model.moe.as_ref().map_or(1, |m| m.n_active as u64);
    let adapted: u64 = model
        .block_tensors(layer_idx)
        .iter()
        .filter(|t| lora::is_target(t, &l.targets))
        .map(|t| if t.count > 1 { active } else { 1 })
        .sum();
    adapted * act_bytes(setup.precision) * tokens * l.rank as u64
}

/// 16-bit weight bytes of a block on one TP rank (autocast's per-forward copies).
fn autocast_bytes(model: &ModelShape, setup: &TrainSetup, layer_idx: u32) -> u64 {
    let tp = setup.tp as u64;
    let numel: u64 = model
        .block_tensors(layer_idx)
        .iter()
        .filter(|t| t.kind == crate::params::TensorKind::Linear)
        .map(|t| {
            if t.tp_split {
                t.numel().div_ceil(tp)
            } else {
                t.numel()
            }
        })
        .sum();
    2 * numel
}

/// Pushes every activation and workspace buffer of stage `st` onto `plan`.
pub fn activations(plan: &mut MemoryPlan, model: &ModelShape, setup: &TrainSetup, st: &StageView) {
    let n = st.n_layers;
    let recompute = RecomputePlan::of(setup.recompute, n);
    let k = recompute.segment_len.unwrap_or(0);
    let autocast = Policy::of(setup.precision).autocast_copy && setup.lora.is_none();
    let kinds = block_kinds(model, setup);
    for i in 0..n {
        let layer = st.first_layer + i;
        let (acts, extra, copy) = kinds[usize::from(model.is_moe_layer(layer))];
        let saved = match recompute.kept {
            Kept::Everything => acts.saved_bytes,
            Kept::AllButAttentionCore => acts.selective_bytes,
            Kept::MatmulOutputs => acts.keep_matmuls_bytes,
        } + extra;
        let (fwd, bwd) = (Phase::Forward(i), Phase::Backward(i));
        if let Some(seg_first) = i.checked_div(k).map(|q| q * k) {
            let seg_last = (seg_first + k).min(n) - 1;
            if i == seg_first {
                let kept = acts.input_bytes * st.in_flight;
                push(
                    plan,
                    format!("h.{layer}.input"),
                    Category::Activations,
                    kept,
                    span(fwd, bwd),
                );
            }
            // The forward runs without saving; the block's tensors live only while it runs.
            push(
                plan,
                format!("h.{layer}.fwd_tmp"),
                Category::Activations,
                saved,
                span(fwd, fwd),
            );
            let born = Phase::Backward(seg_last);
            push(
                plan,
                format!("h.{layer}.recomputed"),
                Category::Activations,
                saved,
                span(born, bwd),
            );
        } else {
            push(
                plan,
                format!("h.{layer}.acts"),
                Category::Activations,
                saved * st.in_flight,
                span(fwd, bwd),
            );
        }
        if autocast {
            // Saved matmuls hold the copies until backward; recomputed ones re-cast them, so the
            // autocast cache alone holds them until the forward's autocast region ends.
            let dies = if k == 0 { bwd } else { Phase::Head };
            push(
                plan,
                format!("h.{layer}.autocast_w"),
                Category::Other,
                copy,
                span(fwd, dies),
            );
        }
    }
    if st.has_embed && model.family == crate::model::Family::Gpt2 {
        let sp_div = if setup.sp { setup.tp as u64 } else { 1 };
        let mask = setup.seq * setup.micro_batch * model.d_model / sp_div * st.in_flight;
        push(
            plan,
            "embed.dropout_mask".into(),
            Category::Activations,
            mask,
            span(Phase::Embed, Phase::EmbedBackward),
        );
    }
    if st.has_head {
        head(plan, model, setup);
    }
    workspaces(plan, st, kinds[0].0);
}

/// (activations, LoRA extra, autocast copy bytes) for dense and MoE blocks.
fn block_kinds(model: &ModelShape, setup: &TrainSetup) -> [(LayerActs, u64, u64); 2] {
    let kind = |layer| {
        (
            LayerActs::of(model, setup, layer),
            lora_bytes(model, setup, layer),
            autocast_bytes(model, setup, layer),
        )
    };
    let dense = kind(0);
    let moe = model.moe.as_ref().map_or(dense, |m| kind(m.first_dense));
    [dense, moe]
}

/// The head: final norm input, the output projection's input, the logits, their fp32 upcast for
/// the loss (HF's `logits.float()`), the log-softmax cross-entropy saves, and the logits' gradient.
fn head(plan: &mut MemoryPlan, model: &ModelShape, setup: &TrainSetup) {
    let a = act_bytes(setup.precision);
    let t = setup.tp as u64;
    let tokens = setup.seq * setup.micro_batch;
    let sp_div = if setup.sp { t } else { 1 };
    let logits = tokens * model.vocab.div_ceil(t);
    let at_head = span(Phase::Head, Phase::Head);
    let acts = Category::Activations;
    push(
        plan,
        "head.norm_input".into(),
        acts,
        a * tokens * model.d_model / sp_div,
        at_head,
    );
    push(
        plan,
        "head.proj_input".into(),
        acts,
        a * tokens * model.d_model,
        at_head,
    );
    push(plan, "head.logits".into(), acts, a * logits, at_head);
    if a < 4 {
        push(plan, "head.logits_fp32".into(), acts, 4 * logits, at_head);
    }
    push(plan, "head.log_probs".into(), acts, 4 * logits, at_head);
    push(
        plan,
        "head.dlogits".into(),
        Category::Other,
        4 * logits,
        at_head,
    );
}

fn workspaces(plan: &mut MemoryPlan, st: &StageView, acts: LayerActs) {
    let whole_backward = span(Phase::Head, Phase::EmbedBackward);
    // The gradient flowing into and out of the block being differentiated.
    push(
        plan,
        "workspace.act_grads".into(),
        Category::Other,
        2 * acts.input_bytes,
        whole_backward,
    );
    if st.n_layers > 0 {
        let life = span(Phase::Backward(st.n_layers - 1), Phase::Backward(0));
        push(
            plan,
            "workspace.block_grad".into(),
            Category::Other,
            acts.widest_grad_bytes,
            life,
        );
    }
    if st.largest_linear_bytes > 0 {
        // QLoRA dequantizes one frozen weight at a time to 16 bits for its matmul.
        let life = span(Phase::Embed, Phase::EmbedBackward);
        push(
            plan,
            "workspace.dequant".into(),
            Category::Other,
            st.largest_linear_bytes,
            life,
        );
    }
}
