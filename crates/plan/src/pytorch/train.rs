//! One PyTorch training step replayed on the tape: forward with the HF loss, backward (with HF's
//! non-reentrant gradient checkpointing), the optimizer step and `zero_grad(set_to_none=True)`.
//!
//! The step is the steady one (optimizer state already exists), as measured in
//! `shared/calibration`. Holds no op details (`blocks.rs`, `layers.rs`). Example:
//! `simulate_step(&shape, &setup)?.peak_bytes`.

use super::blocks::{clear_cast_cache, Fwd, V};
use super::model::{block, embed, head, loss, Params, Storage};
use super::tape::{Tape, T};
use super::{unsupported, OptimizerImpl};
use crate::setup::{Optimizer, Precision, Recompute};
use crate::{Category, ModelShape, Phase, PlanError, TrainSetup};

/// What the replay of one step found.
pub struct StepSim {
    pub tape: Tape,
    pub param_bytes: u64,
    pub optimizer_bytes: u64,
    /// Live bytes after the forward (loss computed), as `torch.cuda.memory_allocated` shows.
    pub after_forward_bytes: u64,
    pub forward_peak_bytes: u64,
}

struct Mode {
    param_es: u64,
    amp: bool,
    states: u64,
}

fn mode(setup: &TrainSetup) -> Result<Mode, PlanError> {
    let (param_es, amp) = match setup.precision {
        Precision::Fp32 => (4, false),
        Precision::AmpBf16 | Precision::AmpFp16 => (4, true),
        Precision::PureBf16 => (2, false),
        Precision::Bf16 | Precision::Fp16 => {
            return Err(unsupported(
                "bf16/fp16 weights with fp32 master weights (a DeepSpeed/Megatron policy, not \
                 plain PyTorch); use amp-bf16, amp-fp16, pure-bf16 or fp32",
            ))
        }
    };
    let states = match setup.optimizer {
        Optimizer::AdamW => 2,
        Optimizer::Sgd => 1,
        Optimizer::AdamW8bit => {
            return Err(unsupported("8-bit AdamW (bitsandbytes); use adamw or sgd"));
        }
    };
    Ok(Mode {
        param_es,
        amp,
        states,
    })
}

fn check(setup: &TrainSetup) -> Result<(), PlanError> {
    if setup.dp > 1 || setup.tp > 1 || setup.pp > 1 {
        return Err(unsupported(
            "data/tensor/pipeline parallelism (ZeRO, FSDP, Megatron); plan one GPU (--gpus 1) or \
             use --runtime frugal",
        ));
    }
    if setup.offload != crate::setup::Offload::None {
        return Err(unsupported(
            "offload (not plain PyTorch); use --offload none",
        ));
    }
    match setup.recompute {
        Recompute::None | Recompute::Full => Ok(()),
        _ => Err(unsupported(
            "recompute policies other than none/full (HF's gradient_checkpointing_enable \
             checkpoints every block)",
        )),
    }
}

/// Replays one steady training step of `model` under `setup`.
pub fn simulate_step(
    m: &ModelShape,
    setup: &TrainSetup,
    opt: OptimizerImpl,
) -> Result<StepSim, PlanError> {
    setup.validate(m)?;
    check(setup)?;
    let md = mode(setup)?;
    let mut tape = Tape::default();
    let storage = Storage {
        es: md.param_es,
        lora: setup.lora.clone(),
        quant: None,
    };
    let params = Params::build(&mut tape, m, &storage)?;
    let param_bytes = params.bytes(&tape);
    let mut optimizer_bytes = 0;
    for &p in &params.all {
        // torch optimizers keep state in each parameter's dtype (fp32 LoRA adapters).
        let info = params.info[p];
        for _ in 0..md.states {
            let state = tape.alloc(info.numel * info.es, Category::Optimizer);
            optimizer_bytes += tape.tensors[state].bytes;
        }
    }
    let n = setup.micro_batch * setup.seq;
    let ids = tape.alloc(n * 8, Category::Other);
    let ckpt = setup.recompute == Recompute::Full;
    let mut f = Fwd {
        batch: setup.micro_batch,
        q_len: setup.seq,
        kv_len: setup.seq,
        param_es: params.es,
        amp: md.amp,
        training: true,
        dropout: m.family == crate::model::Family::Gpt2,
        attention: setup.attention,
        cast_cache: Default::default(),
        kv_cache: Vec::new(),
        use_cache: false,
        params: params.info.clone(),
    };
    tape.phase(Phase::Embed);
    let (mut x, rope) = embed(&mut tape, &mut f, m, &params);
    let embed_ops = tape.ops.len();
    // Per layer: input kept for recompute, output, and the op range recorded.
    let mut layers: Vec<(V, V, usize, usize)> = Vec::new();
    for l in 0..m.n_layers as usize {
        tape.phase(Phase::Forward(l as u32));
        let start = tape.ops.len();
        tape.no_record = ckpt;
        let y = block(&mut tape, &mut f, m, &params, l, x, rope);
        tape.no_record = false;
        if ckpt {
            tape.hold(x.t); // the checkpoint frame keeps the block's input
        }
        tape.drop(x.t);
        layers.push((x, y, start, tape.ops.len()));
        x = y;
    }
    tape.phase(Phase::Head);
    let head_start = tape.ops.len();
    let (normed, logits) = head(&mut tape, &mut f, m, &params, x, None);
    tape.drop(x.t);
    let loss_v = loss(&mut tape, &f, logits);
    let forward_peak_bytes = tape.peak_bytes;
    // The forward returns: the model output (logits, last hidden state) is dropped once `.loss`
    // is taken, and leaving `torch.autocast` clears its weight-cast cache.
    tape.drop(logits.t);
    tape.drop(normed.t);
    clear_cast_cache(&mut tape, &mut f);
    if let Some((cos, sin)) = rope {
        tape.drop(cos.t);
        tape.drop(sin.t);
    }
    let after_forward_bytes = tape.live_bytes;
    tape.seed_grad(loss_v.t);
    let ops_end = tape.ops.len();
    tape.backward(head_start, ops_end);
    for (l, &(input, output, start, end)) in layers.iter().enumerate().rev() {
        tape.phase(Phase::Backward(l as u32));
        if ckpt {
            recompute_backward(&mut tape, &mut f, m, &params, l, input, output, rope)?;
        } else {
            tape.backward(start, end);
        }
    }
    tape.phase(Phase::EmbedBackward);
    tape.backward(0, embed_ops);
    tape.drop_pending_grads();
    tape.drop(loss_v.t);
    tape.phase(Phase::Optimizer);
    optimizer_step(&mut tape, &params.all, setup.optimizer, opt);
    tape.zero_grad(&params.all);
    tape.drop(ids);
    Ok(StepSim {
        tape,
        param_bytes,
        optimizer_bytes,
        after_forward_bytes,
        forward_peak_bytes,
    })
}

/// Non-reentrant checkpointing: the block's forward runs again (under the saved autocast state)
/// when backward first needs one of its tensors, then its backward runs.
#[allow(clippy::too_many_arguments)]
fn recompute_backward(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    p: &Params,
    l: usize,
    input: V,
    output: V,
    rope: Option<(V, V)>,
) -> Result<(), PlanError> {
    let start = tape.ops.len();
    tape.hold(input.t);
    let y = block(tape, f, m, p, l, input, rope);
    clear_cast_cache(tape, f);
    let end = tape.ops.len();
    tape.move_grad(output.t, y.t);
    tape.drop(y.t);
    tape.drop(input.t);
    tape.backward(start, end);
    tape.drop(input.t);
    Ok(())
}

/// The optimizer step's own allocations: foreach AdamW's `_foreach_sqrt(exp_avg_sqs)` list is a
/// full copy of the second moments; fused AdamW and SGD update in place.
fn optimizer_step(tape: &mut Tape, params: &[T], o: Optimizer, imp: OptimizerImpl) {
    if o == Optimizer::AdamW && imp == OptimizerImpl::Foreach {
        let temps: Vec<T> = params
            .iter()
            .map(|&p| tape.alloc(tape.tensors[p].bytes, Category::Optimizer))
            .collect();
        for t in temps {
            tape.drop(t);
        }
    }
}
