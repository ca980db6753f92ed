//! How fast a serving candidate decodes and prefills: decode reads this rank's weights and the
//! batch's KV cache at [`DECODE_BANDWIDTH_EFFICIENCY`] of the HBM bandwidth (the host link's for
//! offloaded weights) or computes at peak × MFU, whichever is slower, plus TP's all-reduces;
//! prefill computes. Modelled, not measured.

use super::InferSpeed;
use super::{Serving, ALLREDUCE_LATENCY_S, DECODE_BANDWIDTH_EFFICIENCY};
use crate::hardware::{Gpu, Hardware};
use plan::infer::InferEstimate;
use plan::ModelShape;

/// Decode and prefill speed of `s` at `batch` × `seq`.
pub fn speed(
    model: &ModelShape,
    s: &Serving,
    batch: u64,
    seq: u64,
    hw: &Hardware,
    e: &InferEstimate,
) -> InferSpeed {
    let gpu: &Gpu = &hw.gpu;
    let tp = s.tp as f64;
    let flops_rate = gpu.bf16_flops * hw.mfu;
    let active = model.active_param_count() as f64;
    let kv_read = (batch * model.kv_tokens_all_layers(seq)) as f64
        * plan::infer::kv_bytes_per_token_layer(model, s.kv_dtype, s.tp) as f64;
    let hbm = gpu.hbm_bytes_per_s * DECODE_BANDWIDTH_EFFICIENCY;
    let (weights_s, mut bound) = if s.offload {
        (
            e.weights_bytes as f64 / gpu.host_link_bytes_per_s,
            "host link",
        )
    } else {
        (e.weights_bytes as f64 / hbm, "memory")
    };
    let memory_s = weights_s + kv_read / hbm;
    let compute_s = 2.0 * active * batch as f64 / tp / flops_rate;
    if compute_s > memory_s {
        bound = "compute";
    }
    let comm_s = if s.tp > 1 {
        let bytes = (batch * model.d_model * 2) as f64;
        model.n_layers as f64 * 2.0 * (ALLREDUCE_LATENCY_S + bytes / gpu.intra_node_bytes_per_s)
    } else {
        0.0
    };
    let step = memory_s.max(compute_s) + comm_s;
    let attn = 2.0
        * model.n_layers as f64
        * (batch * seq * seq) as f64
        * (model.n_heads as u64 * model.d_head) as f64;
    let prefill_flops = 2.0 * active * (batch * seq) as f64 + attn;
    let mut prefill_s = prefill_flops / tp / flops_rate;
    if s.offload {
        prefill_s += e.weights_bytes as f64 / gpu.host_link_bytes_per_s;
    }
    InferSpeed {
        decode_tokens_per_s: batch as f64 / step,
        decode_step_s: step,
        prefill_s,
        bound,
    }
}
