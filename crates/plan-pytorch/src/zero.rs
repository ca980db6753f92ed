//! Optimizer state, gradient buffers and parameter sharding as torch, bitsandbytes and DeepSpeed
//! lay them out on one rank.
//!
//! - Plain torch (ZeRO 0, no master copy, one GPU): one state tensor per parameter and moment, in
//!   the parameter's dtype. bitsandbytes `AdamW8bit`: uint8 moments with an fp32 absmax per 256
//!   for tensors of at least 4096 elements (`min_8bit_size`), fp32 moments below that.
//! - DDP (ZeRO 0, dp > 1): the reducer's bucket buffers, as large as the gradients
//!   (`gradient_as_bucket_view=False`), live for the whole run.
//! - DeepSpeed (`bf16`/`fp16` precision, or ZeRO ≥ 1): flat fp32 master weights and moments,
//!   partitioned over the ranks from stage 1 (each rank holds ⌈P/N⌉ elements); the bf16 optimizer
//!   without ZeRO accumulates gradients in a flat fp32 buffer. Stage 2 reduces each block's
//!   gradients as backward leaves it into the rank's partition (16-bit) through the contiguous
//!   `reduce_bucket_size` buffer (5×10^8 elements, capped at P); stage 3 also partitions the
//!   16-bit parameters and gathers each block's before its forward and backward, prefetching the
//!   next one's first tensors up to `stage3_prefetch_bucket_size` (5×10^7 elements). At the step
//!   the rank's gradient partition is upcast to fp32 (stage 3: one `sub_group_size` group of 10^9
//!   elements at a time). Optimizer offload moves master, moments and that fp32 partition to
//!   host memory, and stages 2-3 then keep no 16-bit gradient partition on the device.
//!
//! Example: `Sharding::of(&setup, total_trainable)` then `sharding.alloc_states(&mut tape, ..)`.

use super::tape::{Tape, T};
use plan::setup::{Offload, Optimizer, Precision, TrainSetup, ZeroBuffers, ZeroStage};
use plan::Category;

/// bitsandbytes' 8-bit optimizers quantize state tensors of at least this many elements.
const MIN_8BIT_SIZE: u64 = 4096;

/// How one rank holds the model states.
#[derive(Clone, Copy, Debug)]
pub struct Sharding {
    pub stage: u8,
    pub ranks: u64,
    /// fp32 master weights kept apart from 16-bit model weights (DeepSpeed bf16/fp16).
    pub master: bool,
    /// DeepSpeed manages the states (flat, partitioned buffers) rather than a torch optimizer.
    pub deepspeed: bool,
    pub offload: bool,
    /// Trainable elements.
    pub total: u64,
    /// DeepSpeed's `reduce_bucket_size` and `sub_group_size`.
    pub buffers: ZeroBuffers,
}

impl Sharding {
    pub fn of(setup: &TrainSetup, total: u64) -> Sharding {
        let master = matches!(setup.precision, Precision::Bf16 | Precision::Fp16);
        let stage = match setup.zero {
            ZeroStage::Zero0 => 0,
            ZeroStage::Zero1 => 1,
            ZeroStage::Zero2 => 2,
            ZeroStage::Zero3 => 3,
        };
        Sharding {
            stage,
            ranks: setup.dp as u64,
            master,
            deepspeed: master || stage > 0,
            offload: setup.offload != Offload::None,
            total,
            buffers: setup.zero_buffers,
        }
    }

    /// Elements of this rank's partition of the flat optimizer state.
    pub fn shard(&self) -> u64 {
        if self.stage >= 1 {
            self.total.div_ceil(self.ranks)
        } else {
            self.total
        }
    }

    /// Allocates the optimizer state; returns (device bytes, host bytes).
    pub fn alloc_states(
        &self,
        tape: &mut Tape,
        params: &[(T, u64, u64)],
        opt: Optimizer,
        states: u64,
    ) -> (u64, u64) {
        if !self.deepspeed {
            let mut bytes = 0;
            for &(_, numel, es) in params {
                for b in torch_state_bytes(numel, es, opt, states) {
                    let s = tape.alloc(b, Category::Optimizer);
                    bytes += tape.tensors[s].bytes;
                }
            }
            return (bytes, 0);
        }
        let shard = self.shard();
        let mut per_elem = states * 4;
        if opt == Optimizer::AdamW8bit {
            per_elem = 2;
        }
        let mut parts = vec![per_elem * shard];
        if self.master {
            parts.push(4 * shard);
        }
        if opt == Optimizer::AdamW8bit {
            parts.push(2 * 4 * shard.div_ceil(256));
        }
        if self.offload {
            // Master, moments and the fp32 gradient partition live in pinned host memory.
            let host: u64 = parts.iter().sum::<u64>() + 4 * shard;
            return (0, host);
        }
        let mut bytes = 0;
        for b in parts {
            let s = tape.alloc(b, Category::Optimizer);
            bytes += tape.tensors[s].bytes;
        }
        (bytes, 0)
    }

    /// Gradient buffers alive for the whole run: DDP's buckets, the bf16 optimizer's fp32
    /// accumulator, stage 2/3's 16-bit partition and reduce bucket.
    pub fn alloc_grad_buffers(&self, tape: &mut Tape, grad_es: u64) {
        if self.stage == 0 && self.ranks > 1 {
            tape.alloc(self.total * grad_es, Category::Grads);
        }
        if self.stage == 0 && self.master {
            tape.alloc(self.total * 4, Category::Grads);
        }
        if self.stage >= 2 {
            // With the optimizer offloaded, ZeRO-2 copies each reduced gradient straight into
            // the host's fp32 partition and ZeRO-3 keeps its partition buffer on the CPU.
            if !self.offload {
                tape.alloc(self.shard() * grad_es, Category::Grads);
            }
            tape.alloc(
                self.total.min(self.buffers.reduce_bucket) * grad_es,
                Category::Other,
            );
        }
    }

    /// The step's fp32 copy of this rank's gradient partition (DeepSpeed, on the device).
    pub fn step_temps(&self, tape: &mut Tape) {
        if self.deepspeed && self.stage >= 1 && !self.offload {
            // ZeRO-3 steps one `sub_group_size` group of the partition at a time.
            let elems = if self.stage >= 3 {
                self.shard().min(self.buffers.sub_group)
            } else {
                self.shard()
            };
            let t = tape.alloc(elems * 4, Category::Grads);
            tape.drop(t);
        }
    }
}

/// One torch optimizer's state tensors for a parameter.
fn torch_state_bytes(numel: u64, es: u64, opt: Optimizer, states: u64) -> Vec<u64> {
    match opt {
        Optimizer::AdamW8bit if numel >= MIN_8BIT_SIZE => {
            let absmax = 4 * numel.div_ceil(256);
            vec![numel, numel, absmax, absmax]
        }
        Optimizer::AdamW8bit => vec![4 * numel, 4 * numel],
        _ => vec![numel * es; states as usize],
    }
}
