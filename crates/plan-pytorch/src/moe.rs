//! Mixture-of-experts MLPs (Mixtral, DeepSeek) and DeepSeek's multi-head latent attention, as HF
//! transformers 5.x runs them, on the [`Tape`].
//!
//! Experts: HF 5 stores each layer's experts as 3-D parameters (`gate_up_proj` [E, 2F, C],
//! `down_proj` [E, C, F]) and its default `experts_implementation="grouped_mm"` sorts the N·k
//! (token, expert) pairs by expert, gathers their hidden states (`hidden[perm // k]`), runs one
//! grouped matmul per projection over all S = N·k rows, weights the rows by the fp32 router
//! scores, un-permutes and sums the k rows of each token. Memory therefore depends on S only, not
//! on how tokens spread over experts (no uniform-routing assumption is needed). Assumed: CUDA
//! autocast treats `grouped_mm` like `mm` (bf16 inputs, cached bf16 weight copies).
//! MLA: HF 5 caches the compressed latent (`kv_a_layernorm` output, kv_lora_rank per token) and
//! the shared RoPE key, and decompresses the whole cache through `kv_b_proj` at every call into
//! per-head keys (a fresh [B, H, T, nope+rope] tensor) and values (a view of the projection).
//! Not here: DeepSeek's node-limited group routing details (its [N, E] score tensors are small).
//! Example: `moe_mlp(&mut tape, &mut f, &shape, x, &layer_params)`.

use super::blocks::{add, alloc, cast, ew, ew_saving_output, linear, rms_norm, weight, Fwd, V};
use super::layers::{apply_rope, cache_update, sdpa_o_proj, swiglu_mlp, LayerParams};
use super::peft::frozen_quant_linear;
use super::tape::{Grad, Tape, T};
use plan::model::{Family, ModelShape};

/// The router: logits, fp32 scores (softmax for Mixtral, sigmoid for DeepSeek), top-k weights.
/// Returns the [N, k] fp32 routing weights (they require grad).
fn router(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, x: V, w: T, e: u64, k: u64) -> V {
    let n = x.numel / m.d_model;
    let logits = linear(tape, f, x, w, m.d_model, e, None);
    let l32 = cast(tape, logits, 4);
    tape.drop(logits.t);
    let scores = ew_saving_output(tape, n * e, 4, l32);
    tape.drop(l32.t);
    let idx = alloc(tape, n * k, 8);
    let top = ew(tape, n * k, 4, &[idx], &[scores]); // topk: saves its int64 indices
    tape.drop_all(&[idx.t, scores.t]);
    let norm = ew(tape, n * k, 4, &[top], &[top]); // / sum(-1): saves both operands
    tape.drop(top.t);
    norm
}

/// One grouped matmul over the S gathered rows with the experts' weights `ws` (concatenated
/// along the output): like `mm`, it saves its input (for the weights' gradient) and the weights.
fn grouped_mm(tape: &mut Tape, f: &mut Fwd, x: V, ws: &[T], d_in: u64, d_out: u64) -> V {
    let rows = x.numel / d_in;
    let info = f.info(ws[0]);
    if let Some(q) = info.quant {
        // Quantized experts (inference): dequantized one expert at a time.
        return frozen_quant_linear(tape, x, q, d_in, d_out);
    }
    let es = if f.amp { 2 } else { info.es };
    let xin = cast(tape, x, es);
    let copies: Vec<V> = ws
        .iter()
        .map(|&w| {
            let numel = f.info(w).numel;
            weight(tape, f, w, numel)
        })
        .collect();
    let y = alloc(tape, rows * d_out, es);
    let op = tape.op(&[y.t]);
    if info.trainable {
        tape.save(op, xin.t);
    }
    let mut grads = vec![Grad::New(xin.t)];
    for (c, &w) in copies.iter().zip(ws) {
        tape.save(op, c.t);
        grads.push(Grad::Param {
            param: w,
            bytes: f.info(w).numel * es,
        });
    }
    tape.grads(op, &grads);
    tape.drop(xin.t);
    for c in copies {
        tape.drop(c.t);
    }
    y
}

/// `MixtralSparseMoeBlock` / `DeepseekV3MoE` on the normed hidden states `x`; returns the MLP
/// output in `x`'s dtype.
pub fn moe_mlp(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, x: V, p: &LayerParams) -> V {
    let moe = m.moe.as_ref().expect("an MoE layer");
    let (h, e, k, ff) = (
        m.d_model,
        moe.n_experts as u64,
        moe.n_active as u64,
        moe.d_ff_expert,
    );
    let n = x.numel / h;
    let s = n * k;
    let weights = router(tape, f, m, x, p.get("gate"), e, k);
    // sort + perm: int64 [S] each, no grad.
    let perm = tape.alloc(2 * s * 8, plan::Category::Activations);
    let gathered = ew(tape, s * h, x.es, &[], &[x]); // hidden[perm // k]: saves the int64 index
    let sw = ew(tape, s, 4, &[], &[weights]); // sample_weights[perm]
    tape.drop(weights.t);
    let (gate_up, down): (Vec<T>, T) = match m.family {
        Family::Mixtral => (vec![p.get("w1"), p.get("w3")], p.get("w2")),
        _ => (
            vec![p.get("experts.gate_proj"), p.get("experts.up_proj")],
            p.get("experts.down_proj"),
        ),
    };
    let gu = grouped_mm(tape, f, gathered, &gate_up, h, 2 * ff);
    tape.drop(gathered.t);
    // act_fn(gate) * up on the two halves (views of `gu`, which both ops keep).
    let act = ew(tape, s * ff, gu.es, &[gu], &[gu]);
    let prod = ew(tape, s * ff, gu.es, &[act, gu], &[act, gu]);
    tape.drop_all(&[act.t, gu.t]);
    let dn = grouped_mm(tape, f, prod, &[down], ff, h);
    tape.drop(prod.t);
    let weighted = ew(tape, s * h, dn.es.max(4), &[dn, sw], &[dn, sw]); // * fp32 scores
    tape.drop_all(&[dn.t, sw.t]);
    let unperm = ew(tape, s * h, weighted.es, &[], &[weighted]); // [inv_perm]
    tape.drop_all(&[weighted.t, perm]);
    let summed = ew(tape, n * h, unperm.es, &[], &[unperm]); // view(N, k, C).sum(1)
    tape.drop(unperm.t);
    let routed = cast(tape, summed, x.es);
    tape.drop(summed.t);
    if moe.n_shared == 0 {
        return routed;
    }
    let names = [
        "shared_experts.gate_proj",
        "shared_experts.up_proj",
        "shared_experts.down_proj",
    ];
    let shared = swiglu_mlp(tape, f, x, h, ff * moe.n_shared as u64, p, names);
    let out = add(tape, routed, shared);
    tape.drop_all(&[routed.t, shared.t]);
    out
}

/// `DeepseekV3Attention.forward` on the normed hidden states `y`; returns the `o_proj` output.
pub fn mla_attention(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    layer: usize,
    y: V,
    p: &LayerParams,
    rope: V,
) -> V {
    let mla = m.mla.as_ref().expect("an MLA model");
    let (h, heads) = (m.d_model, m.n_heads as u64);
    let n = f.tokens();
    let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    let q = match mla.q_lora_rank {
        Some(r) => {
            let qa = linear(tape, f, y, p.get("q_a_proj"), h, r, None);
            let qn = rms_norm(tape, f, qa, r, p.get("q_a_layernorm"));
            tape.drop(qa.t);
            let q = linear(tape, f, qn, p.get("q_b_proj"), r, heads * qk, None);
            tape.drop(qn.t);
            q
        }
        None => linear(tape, f, y, p.get("q_proj"), h, heads * qk, None),
    };
    let kv_r = mla.kv_lora_rank;
    let rd = mla.qk_rope_head_dim;
    let ckv = linear(tape, f, y, p.get("kv_a_proj_with_mqa"), h, kv_r + rd, None);
    let kv_nope = rms_norm(
        tape,
        f,
        V {
            numel: n * kv_r,
            ..ckv
        },
        kv_r,
        p.get("kv_a_layernorm"),
    );
    let q_rot = V {
        numel: n * heads * rd,
        ..q
    };
    let k_rot = V {
        numel: n * rd,
        ..ckv
    };
    let q_rot = apply_rope(tape, q_rot, rope);
    let k_rot = apply_rope(tape, k_rot, rope);
    tape.drop(ckv.t);
    let (lat, kr) = cache_update(tape, f, layer, kv_nope, k_rot);
    tape.drop_all(&[kv_nope.t, k_rot.t]);
    let query = ew(tape, n * heads * qk, q.es.max(q_rot.es), &[], &[q, q_rot]); // cat
    tape.drop_all(&[q.t, q_rot.t]);
    // expand_kv over the whole cache: kv_b_proj, a new key tensor, values as a view.
    let t_kv = lat.numel / kv_r;
    let kvb = linear(
        tape,
        f,
        lat,
        p.get("kv_b_proj"),
        kv_r,
        heads * (mla.qk_nope_head_dim + mla.v_head_dim),
        None,
    );
    let key = ew(tape, t_kv * heads * qk, kvb.es, &[], &[kvb, kr]);
    tape.drop_all(&[lat.t, kr.t]);
    let value = V {
        numel: t_kv * heads * mla.v_head_dim,
        ..kvb
    };
    let free = [query.t, key.t, kvb.t];
    let d_attn = heads * mla.v_head_dim;
    sdpa_o_proj(
        tape,
        f,
        m,
        [query, key, value],
        free,
        p.get("o_proj"),
        d_attn,
    )
}
