//! The `pytorch` profile's inference plan in the shape of the report's other runtimes.

use plan::setup::InferSetup;
use plan::{infer, InferEstimate, ModelShape};

/// The `pytorch` profile's inference answer in the report's shape: weights, KV cache, and the
/// rest of each phase's peak as activations (cuBLAS workspaces as other).
pub(super) fn pytorch_inference(
    model: &ModelShape,
    setup: &InferSetup,
) -> anyhow::Result<InferEstimate> {
    setup.validate(model)?;
    let d = plan_pytorch::inference_estimate(model, setup, Some(1))?;
    let phase = |peak: u64| {
        let mut c = [0u64; 6];
        c[0] = d.weights_bytes;
        c[4] = d.kv_cache_bytes;
        c[5] = d.workspace_bytes;
        c[3] = peak.saturating_sub(d.weights_bytes + d.kv_cache_bytes + d.workspace_bytes);
        c
    };
    let per_token =
        infer::kv_bytes_per_token_layer(model, setup.kv_dtype, setup.tp) * model.n_layers as u64;
    // A paged pool (vLLM's layout in this profile: every layer holds the whole context, a
    // window or not) holds whole blocks of the prompt and the decoded token; the rest is waste.
    let waste = match setup.kv_block {
        Some(_) => d
            .kv_cache_bytes
            .saturating_sub(setup.batch * (setup.seq + 1) * per_token),
        None => 0,
    };
    Ok(InferEstimate {
        weights_bytes: d.weights_bytes,
        kv_cache_bytes: d.kv_cache_bytes,
        kv_waste_bytes: waste,
        kv_bytes_per_token: per_token,
        prefill: phase(d.prefill_peak_bytes),
        decode: phase(d.decode_peak_bytes),
        peak_bytes: d.prefill_peak_bytes.max(d.decode_peak_bytes),
        reserved_bytes: d.reserved_bytes,
        context_bytes: d.context_bytes,
    })
}
