//! One PyTorch training step replayed on the tape: forward with the HF loss, backward (with
//! non-reentrant checkpointing of segments of blocks), the optimizer step and
//! `zero_grad(set_to_none=True)`, on one rank of a DDP or DeepSpeed ZeRO 0-3 group ([`zero`]).
//!
//! The step is the steady one (optimizer state already exists), as measured in
//! `shared/calibration`. Recompute: `full` is HF's `gradient_checkpointing_enable` (every block);
//! `every:K` and `sqrt` checkpoint K consecutive blocks as one `torch.utils.checkpoint` segment
//! (only the segment's input is kept; backward recomputes all K blocks, then runs their
//! backward). Holds no op details (`blocks.rs`, `layers.rs`). Example:
//! `simulate_step(&shape, &setup, OptimizerImpl::Fused)?.tape.peak_bytes`.
//!
//! [`zero`]: super::zero

use super::blocks::{clear_cast_cache, Fwd, V};
use super::model::{block, embed, head, loss, Params, Storage};
use super::tape::{Tape, T};
use super::zero::Sharding;
use super::{unsupported, OptimizerImpl};
use plan::setup::{Optimizer, Precision, Recompute, ZeroBuffers};
use plan::{Category, ModelShape, Phase, PlanError, TrainSetup};

/// What the replay of one step found.
pub struct StepSim {
    pub tape: Tape,
    /// Where the tape's events sit in a run's first and later steps (for the allocator).
    pub order: super::allocator::StepOrder,
    pub param_bytes: u64,
    pub optimizer_bytes: u64,
    /// Optimizer state (and fp32 gradient partition) offloaded to host memory.
    pub host_bytes: u64,
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
        // DeepSpeed's bf16/fp16: the module runs in 16 bits (no autocast); masters in `zero.rs`.
        Precision::PureBf16 | Precision::Bf16 | Precision::Fp16 => (2, false),
    };
    let states = match setup.optimizer {
        Optimizer::AdamW | Optimizer::AdamW8bit => 2,
        Optimizer::Sgd => 1,
    };
    Ok(Mode {
        param_es,
        amp,
        states,
    })
}

fn check(setup: &TrainSetup) -> Result<(), PlanError> {
    if setup.tp > 1 || setup.pp > 1 {
        return Err(unsupported(
            "tensor/pipeline parallelism in training (Megatron, not HF + DeepSpeed); use --tp 1 \
             --pp 1 or --runtime formula",
        ));
    }
    if setup.offload == plan::setup::Offload::Params {
        return Err(unsupported(
            "parameter offload (ZeRO-Infinity NVMe/CPU parameter swapping); use --offload \
             optimizer",
        ));
    }
    if setup.lora.is_some() && matches!(setup.precision, Precision::Bf16 | Precision::Fp16) {
        return Err(unsupported(
            "LoRA with DeepSpeed master weights (PEFT keeps fp32 adapters); use amp-bf16",
        ));
    }
    if matches!(
        setup.recompute,
        Recompute::Selective | Recompute::KeepMatmuls
    ) {
        return Err(unsupported(
            "selective or keep-matmuls recompute (HF checkpoints whole blocks, and SDPA \
             already keeps no attention scores); use full, every:K or sqrt",
        ));
    }
    Ok(())
}

/// Blocks per checkpointed segment (`None`: no recompute).
fn segment_len(setup: &TrainSetup, n_layers: u32) -> Option<usize> {
    let plan = plan::recompute::RecomputePlan::of(setup.recompute, n_layers);
    plan.segment_len.map(|k| k as usize)
}

/// ZeRO-3's partitioned parameters: each block's (and the embedding's and head's) are released
/// after build and gathered around their use. Small ones stay resident (DeepSpeed's
/// `stage3_param_persistence_threshold`, 10^5 elements by default).
struct Gather {
    blocks: Vec<Vec<T>>,
    /// `stage3_prefetch_bucket_size`, in elements.
    prefetch: u64,
    /// The token embedding, and the head (the same tensor when tied).
    embed: Vec<T>,
    head: Vec<T>,
}

/// The two units outside the blocks.
#[derive(Clone, Copy)]
enum Outer {
    Embed,
    Head,
}

impl Gather {
    fn new(tape: &mut Tape, p: &Params, on: bool, zb: &ZeroBuffers) -> Option<Gather> {
        if !on {
            return None;
        }
        let persist = zb.persistence_threshold;
        let big = |ts: &mut dyn Iterator<Item = T>, tape: &Tape| -> Vec<T> {
            ts.filter(|&t| tape.tensors[t].bytes > 2 * persist)
                .collect()
        };
        let blocks: Vec<Vec<T>> = p
            .layers
            .iter()
            .map(|l| big(&mut l.t.iter().copied(), tape))
            .collect();
        let embed = big(&mut [p.embed].into_iter(), tape);
        let head = big(&mut [p.head].into_iter(), tape);
        for &t in blocks.iter().flatten().chain(&embed).chain(&head) {
            tape.release(t);
        }
        // HF builds the model under `deepspeed.zero.Init` when ZeRO-3 is configured.
        tape.forget_released();
        Some(Gather {
            blocks,
            prefetch: zb.prefetch_bucket,
            embed,
            head,
        })
    }

    /// All-gathers block `l` and prefetches the start of `next`, up to DeepSpeed's
    /// `stage3_prefetch_bucket_size` (5×10^7 elements by default); the previous holder releases.
    fn block(&self, tape: &mut Tape, l: usize, next: Option<usize>) {
        for &t in &self.blocks[l] {
            tape.restore(t);
        }
        let mut budget = self.prefetch;
        for &t in next.map_or(&[][..], |n| &self.blocks[n]) {
            let elems = tape.tensors[t].bytes / 2;
            if elems > budget {
                break;
            }
            budget -= elems;
            tape.restore(t);
        }
    }

    fn release_block(&self, tape: &mut Tape, l: usize) {
        for &t in &self.blocks[l] {
            tape.release(t);
        }
    }

    fn outer(&self, tape: &mut Tape, which: Outer, on: bool) {
        let ts = match which {
            Outer::Embed => &self.embed,
            Outer::Head => &self.head,
        };
        for &t in ts {
            if on {
                tape.restore(t);
            } else {
                tape.release(t);
            }
        }
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
    let trainable: Vec<(T, u64, u64)> = params
        .all
        .iter()
        .map(|&p| (p, params.info[p].numel, params.info[p].es))
        .collect();
    let total: u64 = trainable.iter().map(|x| x.1).sum();
    let sh = Sharding::of(setup, total);
    let gather = Gather::new(&mut tape, &params, sh.stage >= 3, &setup.zero_buffers);
    let mut param_bytes = params.bytes(&tape);
    if gather.is_some() {
        let resident = tape.live_bytes; // only parameters exist so far
        let shard = tape.alloc(total.div_ceil(sh.ranks) * md.param_es, Category::Params);
        param_bytes = resident + tape.tensors[shard].bytes;
    }
    let states_from = tape.events.len();
    let (optimizer_bytes, host_bytes) =
        sh.alloc_states(&mut tape, &trainable, setup.optimizer, md.states);
    let states_to = tape.events.len();
    sh.alloc_grad_buffers(&mut tape, md.param_es);
    let ids = tape.alloc(setup.micro_batch * setup.seq * 8, Category::Other);
    let step_from = tape.events.len();
    let mut f = Fwd {
        batch: setup.micro_batch,
        q_len: setup.seq,
        kv_len: setup.seq,
        param_es: params.es,
        amp: md.amp,
        fp16: matches!(setup.precision, Precision::AmpFp16 | Precision::Fp16),
        training: true,
        dropout: m.family == plan::model::Family::Gpt2,
        attention: setup.attention,
        cast_cache: Default::default(),
        kv_cache: Vec::new(),
        use_cache: false,
        kv_block: None,
        window: None,
        mask: None,
        params: params.info.clone(),
    };
    let seg = segment_len(setup, m.n_layers);
    let run = Run {
        m,
        p: &params,
        gather: gather.as_ref(),
        seg,
        reduce_blocks: sh.stage >= 2,
    };
    let fwd = run.forward(&mut tape, &mut f);
    run.backward(&mut tape, &mut f, &fwd);
    tape.phase(Phase::Optimizer);
    let optimizer_at = tape.events.len();
    sh.step_temps(&mut tape);
    optimizer_step(&mut tape, &params.all, setup.optimizer, opt, sh.deepspeed);
    tape.zero_grad(&params.all);
    tape.drop(ids);
    // A torch optimizer creates its state in the first `step()`; DeepSpeed at initialisation.
    let order = super::allocator::StepOrder {
        states: states_from..states_to,
        step_from,
        optimizer_at,
        lazy_states: !sh.deepspeed,
    };
    Ok(StepSim {
        order,
        tape,
        param_bytes,
        optimizer_bytes,
        host_bytes,
        after_forward_bytes: fwd.after_forward_bytes,
        forward_peak_bytes: fwd.forward_peak_bytes,
    })
}

struct Run<'a> {
    m: &'a ModelShape,
    p: &'a Params,
    gather: Option<&'a Gather>,
    seg: Option<usize>,
    /// ZeRO 2/3: a block's gradients leave for the reduce bucket once its backward is done.
    reduce_blocks: bool,
}

struct Forward {
    /// Per segment: its input, its output, first and end layer.
    segments: Vec<(V, V, usize, usize)>,
    /// Per layer without recompute: the recorded op range.
    layer_ops: Vec<(usize, usize)>,
    embed_ops: usize,
    head_start: usize,
    loss: V,
    rope: Option<(V, V)>,
    after_forward_bytes: u64,
    forward_peak_bytes: u64,
}

impl Run<'_> {
    fn forward(&self, tape: &mut Tape, f: &mut Fwd) -> Forward {
        let (m, p) = (self.m, self.p);
        let n = m.n_layers as usize;
        tape.phase(Phase::Embed);
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Embed, true);
        }
        let (mut x, rope) = embed(tape, f, m, p);
        let embed_ops = tape.ops.len();
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Embed, false);
        }
        let seg = self.seg.unwrap_or(1);
        let mut segments = Vec::new();
        let mut layer_ops = Vec::new();
        for first in (0..n).step_by(seg) {
            let end = (first + seg).min(n);
            let input = x;
            if self.seg.is_some() {
                tape.hold(input.t); // the checkpoint frame keeps the segment's input
            }
            for l in first..end {
                tape.phase(Phase::Forward(l as u32));
                if let Some(g) = self.gather {
                    g.block(tape, l, (l + 1 < n).then_some(l + 1));
                }
                let start = tape.ops.len();
                tape.no_record = self.seg.is_some();
                let y = block(tape, f, m, p, l, x, rope);
                tape.no_record = false;
                tape.drop(x.t);
                layer_ops.push((start, tape.ops.len()));
                if let Some(g) = self.gather {
                    g.release_block(tape, l);
                }
                x = y;
            }
            segments.push((input, x, first, end));
        }
        tape.phase(Phase::Head);
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Head, true);
        }
        let head_start = tape.ops.len();
        let (normed, logits) = head(tape, f, m, p, x, None);
        tape.drop(x.t);
        let loss_v = loss(tape, f, logits);
        let forward_peak_bytes = tape.peak_bytes;
        // The model output (logits, last hidden state) is dropped once `.loss` is taken, and
        // leaving `torch.autocast` clears its weight-cast cache.
        tape.drop_all(&[logits.t, normed.t]);
        clear_cast_cache(tape, f);
        if let Some((cos, sin)) = rope {
            tape.drop_all(&[cos.t, sin.t]);
        }
        // Checkpointed segments hold the mask as an input until their backward reruns them.
        if self.seg.is_none() {
            super::model::drop_mask(tape, f);
        }
        Forward {
            segments,
            layer_ops,
            embed_ops,
            head_start,
            loss: loss_v,
            rope,
            after_forward_bytes: tape.live_bytes,
            forward_peak_bytes,
        }
    }

    fn backward(&self, tape: &mut Tape, f: &mut Fwd, fw: &Forward) {
        tape.reduce_on_hook = self.reduce_blocks;
        tape.seed_grad(fw.loss.t);
        let ops_end = tape.ops.len();
        tape.backward(fw.head_start, ops_end);
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Head, false);
        }
        // An untied head's gradient leaves for the reduce bucket like a block's.
        if self.reduce_blocks && self.p.head != self.p.embed {
            tape.zero_grad(&[self.p.head]);
        }
        for &(input, output, first, end) in fw.segments.iter().rev() {
            tape.phase(Phase::Backward(end as u32 - 1));
            if let Some(g) = self.gather {
                for l in first..end {
                    g.block(tape, l, first.checked_sub(1));
                }
            }
            if self.seg.is_some() {
                self.recompute_segment(tape, f, fw, input, output, first, end);
            } else {
                let (start, stop) = fw.layer_ops[first];
                tape.backward(start, stop);
            }
            for l in (first..end).rev() {
                if let Some(g) = self.gather {
                    g.release_block(tape, l);
                }
                if self.reduce_blocks {
                    tape.zero_grad(&self.p.layers[l].t);
                }
            }
        }
        tape.phase(Phase::EmbedBackward);
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Embed, true);
        }
        tape.backward(0, fw.embed_ops);
        if let Some(g) = self.gather {
            g.outer(tape, Outer::Embed, false);
        }
        tape.drop_pending_grads();
        tape.drop(fw.loss.t);
        super::model::drop_mask(tape, f);
    }

    /// Non-reentrant checkpointing: the segment's blocks run again (under the saved autocast
    /// state) when backward first needs one of their tensors, then their backward runs.
    #[allow(clippy::too_many_arguments)]
    fn recompute_segment(
        &self,
        tape: &mut Tape,
        f: &mut Fwd,
        fw: &Forward,
        input: V,
        output: V,
        first: usize,
        end: usize,
    ) {
        let start = tape.ops.len();
        let mut x = input;
        tape.hold(x.t);
        for l in first..end {
            let y = block(tape, f, self.m, self.p, l, x, fw.rope);
            tape.drop(x.t);
            x = y;
        }
        clear_cast_cache(tape, f);
        let stop = tape.ops.len();
        tape.move_grad(output.t, x.t);
        tape.drop(x.t);
        tape.backward(start, stop);
        tape.drop(input.t);
    }
}

/// The optimizer step's own allocations: torch's foreach AdamW `_foreach_sqrt(exp_avg_sqs)`
/// list is a full copy of the second moments; fused AdamW, SGD, bitsandbytes' 8-bit AdamW and
/// DeepSpeed's fused Adam update in place.
fn optimizer_step(tape: &mut Tape, params: &[T], o: Optimizer, imp: OptimizerImpl, ds: bool) {
    if o == Optimizer::AdamW && imp == OptimizerImpl::Foreach && !ds {
        let temps: Vec<T> = params
            .iter()
            .map(|&p| tape.alloc(tape.tensors[p].bytes, Category::Optimizer))
            .collect();
        for t in temps {
            tape.drop(t);
        }
    }
}
