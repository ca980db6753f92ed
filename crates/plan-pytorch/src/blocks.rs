//! HF transformers' forward passes (GPT-2, Llama/Mistral/Qwen2), written op by op onto a [`Tape`].
//!
//! Each helper follows the HF/PyTorch code it names: what it allocates, in which dtype (CUDA
//! autocast casts matmul inputs and weights to bf16, keeps fp32 for `layer_norm`, `pow`, `rsqrt`,
//! and type promotion makes bf16 + fp32 an fp32 tensor), what autograd saves, and when HF's Python
//! variables let go. Holds no training loop (see `train.rs`) and no allocator (`allocator.rs`).
//! Example: `let y = gpt2_block(&mut tape, &mut f, x, &layer_params)`.

use super::peft::{frozen_quant_linear, lora_branch, ParamInfo};
use super::tape::{Grad, Tape, T};
use plan::setup::Attention;
use plan::Category;
use std::collections::HashMap;

const ACT: Category = Category::Activations;

/// A tensor value: its tape id, element count and bytes per element.
#[derive(Clone, Copy, Debug)]
pub struct V {
    pub t: T,
    pub numel: u64,
    pub es: u64,
}

/// How the forward runs: shapes, dtypes and mode.
#[derive(Clone, Debug)]
pub struct Fwd {
    pub batch: u64,
    /// Query tokens per sequence in this call.
    pub q_len: u64,
    /// Key/value tokens per sequence (past cache plus this call).
    pub kv_len: u64,
    /// Bytes per element of parameters (4 fp32, 2 bf16).
    pub param_es: u64,
    /// CUDA autocast to bf16/fp16 is on.
    pub amp: bool,
    /// 16-bit activations are IEEE fp16, not bf16 (CUDA's `softmax(x, dtype=float32)` upcasts
    /// fp16 inside the kernel; bf16 it converts to an fp32 copy first).
    pub fp16: bool,
    pub training: bool,
    /// Dropout probability of GPT-2's residual/embedding/attention dropouts in train mode.
    pub dropout: bool,
    pub attention: Attention,
    /// Autocast's weight-cast cache: parameter → its 16-bit copy, held until autocast exits.
    pub cast_cache: HashMap<T, V>,
    /// Keys and values of the KV cache per layer (inference).
    pub kv_cache: Vec<(V, V)>,
    pub use_cache: bool,
    /// Paged KV cache: block size in tokens and the context the pool is sized for.
    pub kv_block: Option<(u64, u64)>,
    /// Sliding-window layers (`DynamicSlidingWindowLayer`): the cache keeps a view of the last
    /// `window - 1` positions of the concatenated states.
    pub window: Option<plan::model::SlidingWindow>,
    /// The forward's additive attention mask (eager attention only), shared by its layers.
    pub mask: Option<V>,
    /// Per parameter tensor (indexed by its tape id): dtype, trainability, storage, adapter.
    pub params: Vec<ParamInfo>,
}

impl Fwd {
    pub fn tokens(&self) -> u64 {
        self.batch * self.q_len
    }

    /// What the forward knows about parameter `w`.
    pub fn info(&self, w: T) -> ParamInfo {
        self.params[w]
    }

    /// Bytes per element a matmul produces: 2 under autocast, else the parameters' dtype.
    pub fn mm_es(&self) -> u64 {
        if self.amp {
            2
        } else {
            self.param_es
        }
    }
}

/// Allocates a fresh activation of `numel` elements.
pub fn alloc(tape: &mut Tape, numel: u64, es: u64) -> V {
    V {
        t: tape.alloc(numel * es, ACT),
        numel,
        es,
    }
}

/// `x.to(dtype)`: a copy when the dtype changes (ToCopyBackward saves nothing).
pub fn cast(tape: &mut Tape, x: V, es: u64) -> V {
    if x.es == es {
        tape.hold(x.t);
        return x;
    }
    let y = alloc(tape, x.numel, es);
    let op = tape.op(&[y.t]);
    tape.grads(op, &[Grad::New(x.t)]);
    y
}

/// An element-wise op. `saves`: inputs autograd keeps; `grads`: inputs that get gradients.
pub fn ew(tape: &mut Tape, out_numel: u64, out_es: u64, saves: &[V], grads: &[V]) -> V {
    let y = alloc(tape, out_numel, out_es);
    let op = tape.op(&[y.t]);
    for s in saves {
        tape.save(op, s.t);
    }
    let g: Vec<Grad> = grads.iter().map(|x| Grad::New(x.t)).collect();
    tape.grads(op, &g);
    y
}

/// A unary element-wise op whose backward uses its output (`tanh`, `rsqrt`).
pub fn ew_saving_output(tape: &mut Tape, numel: u64, es: u64, x: V) -> V {
    let y = alloc(tape, numel, es);
    let op = tape.op(&[y.t]);
    tape.save(op, y.t);
    tape.grads(op, &[Grad::New(x.t)]);
    y
}

/// `a + b` where both need gradients: the gradient passes through to a same-dtype input and is
/// cast (a copy) for the other.
pub fn add(tape: &mut Tape, a: V, b: V) -> V {
    let es = a.es.max(b.es);
    let y = alloc(tape, a.numel.max(b.numel), es);
    let op = tape.op(&[y.t]);
    let g = |x: V| {
        if x.es == es {
            Grad::Alias(x.t)
        } else {
            Grad::New(x.t)
        }
    };
    tape.grads(op, &[g(a), g(b)]);
    y
}

/// `nn.Linear` / GPT-2's `Conv1D` (`addmm`): `x [.., d_in] @ W [d_in, d_out] (+ bias)`, or a
/// frozen quantized linear, plus PEFT's LoRA branch when `w` carries an adapter.
pub fn linear(
    tape: &mut Tape,
    f: &mut Fwd,
    x: V,
    w: T,
    d_in: u64,
    d_out: u64,
    bias: Option<T>,
) -> V {
    let info = f.info(w);
    let y = match info.quant {
        Some(q) => frozen_quant_linear(tape, x, q, d_in, d_out),
        None => dense_linear(tape, f, x, w, d_in, d_out, bias),
    };
    match info.adapter {
        Some(ad) => {
            let out = lora_branch(tape, f, x, y, ad, d_in);
            tape.drop(y.t);
            out
        }
        None => y,
    }
}

/// A dense linear. Under autocast the input is cast to bf16 (a new copy per call) and the weight
/// to a bf16 copy (cached per forward when it requires grad, fresh per call when frozen). The
/// matmul saves its input only when the weight needs a gradient, and the weight (or its copy)
/// for the input's gradient; the bias copy is not saved.
fn dense_linear(
    tape: &mut Tape,
    f: &mut Fwd,
    x: V,
    w: T,
    d_in: u64,
    d_out: u64,
    bias: Option<T>,
) -> V {
    let rows = x.numel / d_in;
    let info = f.info(w);
    let es = if f.amp { 2 } else { info.es };
    let xin = cast(tape, x, es);
    let wv = weight(tape, f, w, d_in * d_out);
    if let Some(b) = bias {
        let bv = weight(tape, f, b, d_out);
        tape.drop(bv.t);
    }
    let y = alloc(tape, rows * d_out, es);
    let op = tape.op(&[y.t]);
    if info.trainable {
        tape.save(op, xin.t);
    }
    tape.save(op, wv.t);
    let mut g = vec![
        Grad::New(xin.t),
        Grad::Param {
            param: w,
            bytes: d_in * d_out * es,
        },
    ];
    if let Some(b) = bias {
        g.push(Grad::Param {
            param: b,
            bytes: d_out * es,
        });
    }
    tape.grads(op, &g);
    tape.drop_all(&[xin.t, wv.t]);
    y
}

/// The weight operand of a matmul: the parameter itself, or autocast's 16-bit copy (cached only
/// for leaves that require grad, as `cached_cast` does).
pub fn weight(tape: &mut Tape, f: &mut Fwd, w: T, numel: u64) -> V {
    let info = f.info(w);
    if !f.amp || info.es == 2 {
        tape.hold(w);
        return V {
            t: w,
            numel,
            es: info.es,
        };
    }
    if !info.trainable {
        return alloc(tape, numel, 2);
    }
    if let Some(&c) = f.cast_cache.get(&w) {
        tape.hold(c.t);
        return c;
    }
    let c = alloc(tape, numel, 2);
    f.cast_cache.insert(w, c);
    tape.hold(c.t);
    c
}

/// Autocast exits: its cache of weight copies is cleared.
pub fn clear_cast_cache(tape: &mut Tape, f: &mut Fwd) {
    for (_, c) in f.cast_cache.drain() {
        tape.drop(c.t);
    }
}

/// `nn.LayerNorm` (`native_layer_norm`): saves its input and fp32 mean/rstd; fp32 output under
/// autocast (an fp32-list op).
pub fn layer_norm(tape: &mut Tape, f: &Fwd, x: V, d: u64, w: T, b: T) -> V {
    let rows = x.numel / d;
    let es = if f.amp { 4 } else { x.es };
    let y = alloc(tape, x.numel, es);
    let mean = alloc(tape, rows, 4);
    let rstd = alloc(tape, rows, 4);
    let op = tape.op(&[y.t]);
    for s in [x, mean, rstd] {
        tape.save(op, s.t);
    }
    let pg = |p| Grad::Param {
        param: p,
        bytes: d * f.param_es,
    };
    tape.grads(op, &[Grad::New(x.t), pg(w), pg(b)]);
    tape.drop_all(&[mean.t, rstd.t]);
    y
}

/// HF `LlamaRMSNorm.forward`: `x.to(fp32)`, `pow(2).mean`, `x * rsqrt(var + eps)`, back to the
/// input dtype, times the weight. Each step is a separate tensor; the muls save their operands.
pub fn rms_norm(tape: &mut Tape, f: &Fwd, x: V, d: u64, w: T) -> V {
    let rows = x.numel / d;
    let x32 = cast(tape, x, 4);
    let sq = ew(tape, x.numel, 4, &[x32], &[x32]); // pow(2) saves its input
    let var = ew(tape, rows, 4, &[], &[sq]); // mean(-1, keepdim)
    tape.drop(sq.t);
    let ve = ew(tape, rows, 4, &[], &[var]); // + eps
    tape.drop(var.t);
    let rs = ew_saving_output(tape, rows, 4, ve); // rsqrt saves its result
    tape.drop(ve.t);
    let n = ew(tape, x.numel, 4, &[x32, rs], &[x32, rs]);
    tape.drop_all(&[x32.t, rs.t]);
    let nb = cast(tape, n, x.es);
    tape.drop(n.t);
    // `self.weight * hidden`: weight (param dtype) times the cast-back value; saves both.
    let out_es = nb.es.max(f.param_es);
    let y = alloc(tape, x.numel, out_es);
    let op = tape.op(&[y.t]);
    if tape.requires_grad(w) {
        tape.save(op, nb.t); // only the weight's gradient reads the normalised input
    }
    tape.grads(
        op,
        &[
            Grad::New(nb.t),
            Grad::Param {
                param: w,
                bytes: d * out_es,
            },
        ],
    );
    tape.drop(nb.t);
    y
}

/// `nn.Dropout` in train mode with p > 0 (CUDA's fused `native_dropout`: a bool mask is saved).
pub fn dropout(tape: &mut Tape, f: &Fwd, x: V) -> V {
    if !(f.training && f.dropout) {
        tape.hold(x.t);
        return x;
    }
    let y = alloc(tape, x.numel, x.es);
    let mask = alloc(tape, x.numel, 1);
    let op = tape.op(&[y.t]);
    tape.save(op, mask.t);
    tape.grads(op, &[Grad::New(x.t)]);
    tape.drop(mask.t);
    y
}
