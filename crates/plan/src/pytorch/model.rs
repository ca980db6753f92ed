//! The model's parameter tensors and the parts of HF's forward outside the blocks: embeddings,
//! the final norm, the LM head and the loss, shared by training (`train.rs`) and inference
//! (`infer.rs`). Example: `let p = Params::build(&mut tape, &shape, 4)?`.

use super::blocks::{
    alloc, cast, dropout, ew, ew_saving_output, layer_norm, linear, rms_norm, Fwd, V,
};
use super::layers::{gpt2_block, llama_block, LayerParams};
use super::tape::{Grad, Tape, T};
use super::RUNTIME;
use crate::model::{Family, ModelShape};
use crate::{Category, PlanError};

/// Every parameter tensor of an HF causal LM, as `model.parameters()` lists them.
pub struct Params {
    pub embed: T,
    /// GPT-2's learned positions.
    pub pos: Option<T>,
    pub layers: Vec<LayerParams>,
    pub final_norm: Vec<T>,
    /// The LM head's weight (the embedding when tied).
    pub head: T,
    pub all: Vec<T>,
    /// Bytes per element.
    pub es: u64,
}

impl Params {
    pub fn build(tape: &mut Tape, m: &ModelShape, es: u64) -> Result<Params, PlanError> {
        if m.moe.is_some()
            || m.mla.is_some()
            || matches!(m.family, Family::Mixtral | Family::Deepseek)
        {
            return Err(PlanError::Unsupported {
                runtime: RUNTIME,
                what: format!(
                    "{} (mixture-of-experts / latent attention blocks are not modelled op by op; \
                     use --runtime frugal or the formula estimate)",
                    m.name
                ),
            });
        }
        let mut all = Vec::new();
        let mut p = |numel: u64| {
            let t = tape.alloc(numel * es, Category::Params);
            all.push(t);
            t
        };
        let (h, ff) = (m.d_model, m.d_ff);
        let embed = p(m.vocab * h);
        let pos = (m.family == Family::Gpt2).then(|| p(m.max_positions * h));
        let dq = m.n_heads as u64 * m.d_head;
        let dkv = m.n_kv_heads as u64 * m.d_head;
        let mut layers = Vec::new();
        for _ in 0..m.n_layers {
            let sizes: Vec<u64> = match m.family {
                Family::Gpt2 => vec![
                    h,
                    h,
                    h * 3 * h,
                    3 * h,
                    h * h,
                    h,
                    h,
                    h,
                    h * ff,
                    ff,
                    ff * h,
                    h,
                ],
                Family::Qwen2 => vec![
                    h,
                    h * dq,
                    h * dkv,
                    h * dkv,
                    dq * h,
                    dq,
                    dkv,
                    dkv,
                    h,
                    h * ff,
                    h * ff,
                    ff * h,
                ],
                _ => vec![
                    h,
                    h * dq,
                    h * dkv,
                    h * dkv,
                    dq * h,
                    h,
                    h * ff,
                    h * ff,
                    ff * h,
                ],
            };
            layers.push(sizes.into_iter().map(&mut p).collect());
        }
        let final_norm = if m.family == Family::Gpt2 {
            vec![p(h), p(h)]
        } else {
            vec![p(h)]
        };
        let head = if m.tied_embeddings {
            embed
        } else {
            p(m.vocab * h)
        };
        Ok(Params {
            embed,
            pos,
            layers,
            final_norm,
            head,
            all,
            es,
        })
    }

    pub fn bytes(&self, tape: &Tape) -> u64 {
        self.all.iter().map(|&t| tape.tensors[t].bytes).sum()
    }
}

/// Token (and GPT-2 position) embeddings; returns the residual stream and RoPE's cos/sin.
pub fn embed(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, p: &Params) -> (V, Option<(V, V)>) {
    let n = f.tokens();
    let h = m.d_model;
    let tok = alloc(tape, n * h, p.es);
    let op = tape.op(&[tok.t]);
    tape.grads(
        op,
        &[Grad::Param {
            param: p.embed,
            bytes: m.vocab * h * p.es,
        }],
    );
    match p.pos {
        Some(pos) => {
            let pe = alloc(tape, f.q_len * h, p.es);
            let op = tape.op(&[pe.t]);
            tape.grads(
                op,
                &[Grad::Param {
                    param: pos,
                    bytes: m.max_positions * h * p.es,
                }],
            );
            let sum = ew(tape, n * h, p.es, &[], &[tok, pe]);
            tape.drop(tok.t);
            tape.drop(pe.t);
            let x = dropout(tape, f, sum);
            tape.drop(sum.t);
            (x, None)
        }
        None => {
            // LlamaRotaryEmbedding: fp32 cos/sin cast to the embeddings' dtype, [B, T, d_head].
            let cs = f.batch * f.q_len * m.d_head;
            let cos = alloc(tape, cs, p.es);
            let sin = alloc(tape, cs, p.es);
            (tok, Some((cos, sin)))
        }
    }
}

/// Runs block `layer` on `x`.
pub fn block(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    p: &Params,
    layer: usize,
    x: V,
    rope: Option<(V, V)>,
) -> V {
    match rope {
        None => gpt2_block(tape, f, m, layer, x, &p.layers[layer]),
        Some((cos, _)) => llama_block(tape, f, m, layer, x, &p.layers[layer], cos),
    }
}

/// The final norm and LM head over the last `keep` positions (all when `None`); returns the
/// normed hidden states (HF keeps them in the model output) and the logits.
pub fn head(
    tape: &mut Tape,
    f: &mut Fwd,
    m: &ModelShape,
    p: &Params,
    x: V,
    keep: Option<u64>,
) -> (V, V) {
    let h = m.d_model;
    let y = match m.family {
        Family::Gpt2 => layer_norm(tape, f, x, h, p.final_norm[0], p.final_norm[1]),
        _ => rms_norm(tape, f, x, h, p.final_norm[0]),
    };
    let rows = keep.map_or(f.tokens(), |k| f.batch * k.min(f.q_len));
    let yk = if rows == f.tokens() {
        y
    } else {
        // `hidden_states[:, -k:, :]` is a view; the matmul reads it through a contiguous copy.
        alloc(tape, rows * h, y.es)
    };
    let logits = linear(tape, f, yk, p.head, h, m.vocab, None);
    if yk.t != y.t {
        tape.drop(yk.t);
    }
    (y, logits)
}

/// HF `ForCausalLMLoss`: `logits.float()`, shifted labels, `cross_entropy` (log_softmax saves
/// its fp32 output, nll_loss reads it). Returns the scalar loss.
pub fn loss(tape: &mut Tape, f: &Fwd, logits: V) -> V {
    let n = f.tokens();
    let padded = alloc(tape, f.batch * (f.q_len + 1), 8);
    let shifted = alloc(tape, n, 8);
    tape.drop(padded.t);
    let l32 = cast(tape, logits, 4);
    let lsm = ew_saving_output(tape, l32.numel, 4, l32);
    tape.drop(l32.t);
    let loss = ew(tape, 1, 4, &[lsm], &[lsm]);
    tape.drop(lsm.t);
    tape.drop(shifted.t);
    loss
}
