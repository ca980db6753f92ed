//! Attention and whole transformer blocks of HF's GPT-2 and Llama-style models on the [`Tape`].
//!
//! SDPA (`attn_implementation="sdpa"`): bf16/fp16 runs the flash kernel, fp32 the memory-efficient
//! one; both save q, k, v, the output (laid out [B, T, H, D], so HF's `transpose(1, 2).contiguous()`
//! copies nothing) and the fp32 log-sum-exp, never a T x T matrix. fp32 with grouped KV heads falls
//! back to the math kernel, which materialises scores like eager attention. Eager attention keeps
//! the probabilities (fp32 from softmax, the 16-bit copy under autocast) and, with dropout, a bool
//! mask per score. Example: `gpt2_block(&mut tape, &mut fwd, &shape, x, &params)`.

use super::blocks::{
    add, alloc, cast, dropout, ew, ew_saving_output, layer_norm, linear, rms_norm, Fwd, V,
};
use super::moe::{mla_attention, moe_mlp};
use super::tape::{Grad, Tape, T};
use plan::model::{Family, ModelShape};
use plan::setup::Attention;

/// Parameter tensors of one block, by the HF names `ModelShape::block_tensors` gives them.
#[derive(Clone, Debug, Default)]
pub struct LayerParams {
    pub names: Vec<&'static str>,
    pub t: Vec<T>,
}

impl LayerParams {
    /// The tensor called `name`; the block code asks only for names its family has.
    pub fn get(&self, name: &str) -> T {
        self.opt(name)
            .unwrap_or_else(|| panic!("block has no parameter {name}"))
    }

    pub fn opt(&self, name: &str) -> Option<T> {
        self.names
            .iter()
            .position(|n| *n == name)
            .map(|i| self.t[i])
    }
}

/// Query, key and value of one attention call; `fused` is GPT-2's single `c_attn` output they view.
pub struct Qkv {
    pub q: V,
    pub k: V,
    pub v: V,
    pub fused: Option<V>,
}

/// Scaled dot-product attention; returns the output [B, T, H·D].
pub fn attention(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, qkv: &Qkv, mask: Option<V>) -> V {
    let es = qkv.q.es;
    let gqa = m.n_kv_heads < m.n_heads;
    let math = f.attention == Attention::Eager || (es == 4 && gqa && f.training);
    if math {
        return eager_attention(tape, f, m, qkv, mask);
    }
    let heads = m.n_heads as u64;
    let out = alloc(tape, out_numel(qkv), es);
    let lse = alloc(tape, f.batch * heads * f.q_len, 4);
    let op = tape.op(&[out.t]);
    for s in [qkv.q, qkv.k, qkv.v, out, lse] {
        tape.save(op, s.t);
    }
    tape.drop(lse.t);
    // Backward: dq, dk, dv, flash's fp32 dq accumulator and softmax_d, then (GPT-2) the split's
    // backward concatenates dq, dk, dv into the gradient of the fused qkv output.
    let dq_accum = qkv.q.numel * 4;
    let softmax_d = f.batch * heads * f.q_len * 4;
    match qkv.fused {
        Some(fused) => {
            let parts = [qkv.q, qkv.k, qkv.v].map(|x| x.numel * x.es);
            tape.temps(op, &[parts[0], parts[1], parts[2], dq_accum, softmax_d]);
            tape.grads(op, &[Grad::New(fused.t)]);
        }
        None => {
            tape.temps(op, &[dq_accum, softmax_d]);
            tape.grads(
                op,
                &[Grad::New(qkv.q.t), Grad::New(qkv.k.t), Grad::New(qkv.v.t)],
            );
        }
    }
    out
}

/// The attention output's elements: queries' rows times the value head size (MLA's values are
/// narrower than its query/key heads).
fn out_numel(qkv: &Qkv) -> u64 {
    (qkv.q.numel as u128 * qkv.v.numel as u128 / qkv.k.numel.max(1) as u128) as u64
}

/// HF's `eager_attention_forward` (and SDPA's math fallback): scores, softmax, dropout, @ V.
fn eager_attention(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, qkv: &Qkv, mask: Option<V>) -> V {
    let heads = m.n_heads as u64;
    let es = qkv.q.es;
    let (k, v) = if m.n_kv_heads < m.n_heads {
        // repeat_kv: expand + reshape copies K and V to every query head.
        let rep = |tape: &mut Tape, x: V| ew(tape, qkv.q.numel, x.es, &[], &[x]);
        (rep(tape, qkv.k), rep(tape, qkv.v))
    } else {
        tape.hold(qkv.k.t);
        tape.hold(qkv.v.t);
        (qkv.k, qkv.v)
    };
    let scores = f.batch * heads * f.q_len * f.kv_len;
    let s = ew(tape, scores, es, &[qkv.q, k], &[qkv.q, k]); // q @ k^T
    let s2 = ew(tape, scores, es, &[], &[s]); // * scaling
    tape.drop(s.t);
    let s3 = match mask {
        Some(mk) => {
            let s3 = ew(tape, scores, es.max(mk.es), &[], &[s2]);
            tape.drop(s2.t);
            s3
        }
        None => s2,
    };
    // softmax runs in fp32 under autocast (Llama passes dtype=float32 explicitly) and saves its output.
    let soft_es = if f.amp || m.family != Family::Gpt2 {
        4
    } else {
        es
    };
    // The fp32 copy softmax reads: autocast's cast of its input, or (outside autocast) ATen's
    // `input.toType(float)` for bf16; CUDA reads fp16 as it is (`_softmax(half_to_float)`).
    let upcast = (soft_es == 4 && s3.es == 2 && (f.amp || !f.fp16)).then(|| alloc(tape, scores, 4));
    let p32 = ew_saving_output(tape, scores, soft_es, s3);
    if let Some(c) = upcast {
        tape.drop(c.t);
    }
    tape.drop(s3.t);
    let p = cast(tape, p32, es);
    tape.drop(p32.t);
    let gpt2_drop = m.family == Family::Gpt2 && f.dropout && f.training;
    let pd = if gpt2_drop { dropout(tape, f, p) } else { p };
    if gpt2_drop {
        tape.drop(p.t);
    }
    let o = ew(tape, out_numel(qkv), es, &[pd, v], &[pd, v]); // probs @ v, [B, H, T, D]
    tape.drop_all(&[pd.t, k.t, v.t]);
    let out = ew(tape, o.numel, es, &[], &[o]); // transpose(1, 2).contiguous()
    tape.drop(o.t);
    out
}

/// KV cache update (`DynamicLayer.update`: `torch.cat([cache, new], dim=-2)`); returns the full
/// keys and values this call attends to.
pub fn cache_update(tape: &mut Tape, f: &mut Fwd, layer: usize, k: V, v: V) -> (V, V) {
    if !f.use_cache {
        tape.hold(k.t);
        tape.hold(v.t);
        return (k, v);
    }
    let mut out = Vec::new();
    for (i, x) in [k, v].into_iter().enumerate() {
        let old = f
            .kv_cache
            .get(layer)
            .map(|kv| if i == 0 { kv.0 } else { kv.1 });
        let numel = x.numel + old.map_or(0, |o| o.numel);
        let new = match (f.kv_block, old) {
            // A paged pool: whole blocks for the context, allocated once, written in place.
            (Some(_), Some(o)) => V { numel, ..o },
            (Some((block, ctx)), None) => {
                let per_token = x.numel / f.tokens();
                let pool = f.batch * ctx.div_ceil(block) * block * per_token;
                V {
                    numel,
                    ..alloc(tape, pool, x.es)
                }
            }
            (None, _) => {
                let new = alloc(tape, numel, x.es);
                if let Some(o) = old {
                    tape.drop(o.t);
                }
                new
            }
        };
        tape.hold(new.t);
        out.push(new);
    }
    // `DynamicSlidingWindowLayer` keeps `full[:, :, -window + 1:]`, a view: the storage stays.
    let cached = |x: V, new: V| match f.window {
        Some(w) if layer as u32 >= w.first_layer && f.kv_block.is_none() => {
            let per_position = new.numel / f.q_len.max(1);
            V {
                numel: x.numel.min(w.window.saturating_sub(1) * per_position),
                ..x
            }
        }
        _ => x,
    };
    let (ck, cv) = (cached(out[0], k), cached(out[1], v));
    if layer < f.kv_cache.len() {
        f.kv_cache[layer] = (ck, cv);
    } else {
        f.kv_cache.push((ck, cv));
    }
    (out[0], out[1])
}

/// `GPT2Block.forward` (pre-LN, fused c_attn, NewGELU written as element-wise ops).
pub fn gpt2_block(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    layer: usize,
    x: V,
    p: &LayerParams,
) -> V {
    let h = m.d_model;
    let n = f.tokens();
    let y1 = layer_norm(tape, f, x, h, p.get("ln_1.weight"), p.get("ln_1.bias"));
    let qkv = linear(tape, f, y1, p.get("c_attn"), h, 3 * h, p.opt("c_attn.bias"));
    let third = V {
        numel: n * h,
        ..qkv
    };
    let (k, v) = cache_update(tape, f, layer, third, third);
    let kv_numel = k.numel;
    let parts = Qkv {
        q: third,
        k,
        v,
        fused: if f.use_cache { None } else { Some(qkv) },
    };
    let a = attention(tape, f, m, &parts, f.mask);
    let _ = kv_numel;
    tape.drop_all(&[k.t, v.t, qkv.t]);
    let od = c_proj_dropout(tape, f, p, "attn", a, h, h);
    let r2 = add(tape, od, x);
    tape.drop_all(&[od.t, y1.t]);
    let y2 = layer_norm(tape, f, r2, h, p.get("ln_2.weight"), p.get("ln_2.bias"));
    let fc = linear(tape, f, y2, p.get("c_fc"), h, m.d_ff, p.opt("c_fc.bias"));
    let g = new_gelu(tape, f, fc);
    tape.drop(fc.t);
    let md = c_proj_dropout(tape, f, p, "mlp", g, m.d_ff, h);
    let out = add(tape, r2, md);
    tape.drop_all(&[md.t, y2.t, r2.t]);
    out
}

/// GPT-2's `{module}.c_proj` (with its bias) from `d_in` to `d_out`, then the residual dropout;
/// lets `x` and the projection go.
fn c_proj_dropout(
    tape: &mut Tape,
    f: &mut Fwd,
    p: &LayerParams,
    module: &str,
    x: V,
    d_in: u64,
    d_out: u64,
) -> V {
    let name = format!("{module}.c_proj");
    let bias = p.opt(&format!("{name}.bias"));
    let o = linear(tape, f, x, p.get(&name), d_in, d_out, bias);
    tape.drop(x.t);
    let out = dropout(tape, f, o);
    tape.drop(o.t);
    out
}

/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`, evaluated left to right;
/// under autocast `pow` is an fp32 op, so it saves an fp32 copy of x and the rest promotes to fp32.
fn new_gelu(tape: &mut Tape, f: &Fwd, x: V) -> V {
    let n = x.numel;
    let e = ew(tape, n, x.es, &[], &[x]); // 0.5 * x
    let xp = if f.amp {
        cast(tape, x, 4)
    } else {
        cast(tape, x, x.es)
    };
    let p3 = ew(tape, n, xp.es, &[xp], &[xp]); // pow(x, 3) saves x
    tape.drop(xp.t);
    let t1 = ew(tape, n, xp.es, &[], &[p3]); // 0.044715 * p
    tape.drop(p3.t);
    let a = add(tape, x, t1); // x + t1
    tape.drop(t1.t);
    let b = ew(tape, n, a.es, &[], &[a]); // sqrt(2/pi) * a
    tape.drop(a.t);
    let c = ew_saving_output(tape, n, b.es, b); // tanh saves its output
    tape.drop(b.t);
    let d = ew(tape, n, c.es, &[], &[c]); // 1 + c
    tape.drop(c.t);
    let out = ew(tape, n, e.es.max(d.es), &[e, d], &[e, d]); // e * d saves both
    tape.drop_all(&[e.t, d.t]);
    out
}

/// `LlamaDecoderLayer.forward` (also Mistral, Qwen2 with q/k/v biases, Mixtral's MoE MLP and
/// DeepSeek's MLA attention with dense or MoE MLPs).
pub fn llama_block(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    layer: usize,
    x: V,
    p: &LayerParams,
    rope: V,
) -> V {
    let h = m.d_model;
    let y = rms_norm(tape, f, x, h, p.get("input_layernorm"));
    let o = if m.mla.is_some() {
        mla_attention(tape, f, m, layer, y, p, rope)
    } else {
        gqa_attention(tape, f, m, layer, y, p, rope)
    };
    tape.drop(y.t);
    let r2 = add(tape, x, o);
    tape.drop(o.t);
    let y2 = rms_norm(tape, f, r2, h, p.get("post_attention_layernorm"));
    let down = if m.is_moe_layer(layer as u32) {
        moe_mlp(tape, f, m, y2, p)
    } else {
        swiglu_mlp(
            tape,
            f,
            y2,
            h,
            m.d_ff,
            p,
            ["gate_proj", "up_proj", "down_proj"],
        )
    };
    tape.drop(y2.t);
    let out = add(tape, r2, down);
    tape.drop_all(&[down.t, r2.t]);
    out
}

/// `LlamaAttention.forward` on the normed hidden states `y`; returns the `o_proj` output.
fn gqa_attention(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    layer: usize,
    y: V,
    p: &LayerParams,
    rope: V,
) -> V {
    let h = m.d_model;
    let dq = m.n_heads as u64 * m.d_head;
    let dkv = m.n_kv_heads as u64 * m.d_head;
    let q = linear(tape, f, y, p.get("q_proj"), h, dq, p.opt("q_proj.bias"));
    let k = linear(tape, f, y, p.get("k_proj"), h, dkv, p.opt("k_proj.bias"));
    let v = linear(tape, f, y, p.get("v_proj"), h, dkv, p.opt("v_proj.bias"));
    let qe = apply_rope(tape, q, rope);
    tape.drop(q.t);
    let ke = apply_rope(tape, k, rope);
    tape.drop(k.t);
    let (kc, vc) = cache_update(tape, f, layer, ke, v);
    tape.drop_all(&[ke.t, v.t]);
    let qkv = [qe, kc, vc];
    sdpa_o_proj(tape, f, m, qkv, qkv.map(|x| x.t), p.get("o_proj"), dq)
}

/// The tail of a Llama-style attention: autocast runs SDPA in bf16, so `qkv` (fp32 after RoPE's
/// fp32 cos/sin) are cast back first and `free` (the tensors behind them) let go; then SDPA and
/// `o_proj` from the `d_attn`-wide output back to `d_model`. Returns the `o_proj` output.
pub fn sdpa_o_proj(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    qkv: [V; 3],
    free: [T; 3],
    o_proj: T,
    d_attn: u64,
) -> V {
    let es = f.mm_es();
    let [q, k, v] = qkv.map(|x| cast(tape, x, es));
    for t in free {
        tape.drop(t);
    }
    let parts = Qkv {
        q,
        k,
        v,
        fused: None,
    };
    let a = attention(tape, f, m, &parts, f.mask);
    for t in [q, k, v] {
        tape.drop(t.t);
    }
    let o = linear(tape, f, a, o_proj, d_attn, m.d_model, None);
    tape.drop(a.t);
    o
}

/// `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (`LlamaMLP`); returns the down projection.
pub fn swiglu_mlp(
    tape: &mut Tape,
    f: &mut Fwd,
    x: V,
    h: u64,
    d_ff: u64,
    p: &LayerParams,
    names: [&str; 3],
) -> V {
    let gate = linear(tape, f, x, p.get(names[0]), h, d_ff, None);
    let s = ew(tape, gate.numel, gate.es, &[gate], &[gate]); // silu saves its input
    tape.drop(gate.t);
    let up = linear(tape, f, x, p.get(names[1]), h, d_ff, None);
    let prod = ew(tape, s.numel, s.es, &[s, up], &[s, up]);
    tape.drop_all(&[s.t, up.t]);
    let down = linear(tape, f, prod, p.get(names[2]), d_ff, h, None);
    tape.drop(prod.t);
    down
}

/// `q * cos + rotate_half(q) * sin`; cos/sin need no gradient, so nothing of q is saved.
/// `rope.es` is the dtype of cos/sin (the residual stream's: fp32 under autocast).
pub fn apply_rope(tape: &mut Tape, x: V, rope: V) -> V {
    let es = x.es.max(rope.es);
    let a = ew(tape, x.numel, es, &[], &[x]); // x * cos
    let neg = ew(tape, x.numel / 2, x.es, &[], &[x]); // -x2
    let rot = ew(tape, x.numel, x.es, &[], &[neg]); // cat((-x2, x1))
    tape.drop(neg.t);
    let b = ew(tape, x.numel, es, &[], &[rot]); // rot * sin
    tape.drop(rot.t);
    let out = add(tape, a, b);
    tape.drop_all(&[a.t, b.t]);
    out
}
