//! The model's parameter tensors and the parts of HF's forward outside the blocks: embeddings,
//! the final norm, the LM head and the loss, shared by training (`train.rs`) and inference
//! (`infer.rs`). Example: `let p = Params::build(&mut tape, &shape, 4)?`.

use super::blocks::{
    alloc, cast, dropout, ew, ew_saving_output, layer_norm, linear, rms_norm, Fwd, V,
};
use super::layers::{gpt2_block, llama_block, LayerParams};
use super::peft::{quant_storage_bytes, Adapter, ParamInfo, Quant};
use super::tape::{Grad, Tape, T};
use super::unsupported;
use plan::model::{Family, ModelShape};
use plan::params::TensorKind;
use plan::setup::Dtype;
use plan::{Category, PlanError};

/// How the parameters are stored: the dense dtype, and LoRA / quantized linears.
#[derive(Clone, Debug)]
pub struct Storage {
    /// Bytes per element of dense parameters.
    pub es: u64,
    /// PEFT LoRA: every base parameter frozen, adapters (fp32) on the targets, base linears
    /// stored as `lora.base`.
    pub lora: Option<plan::setup::Lora>,
    /// Block linears (not embeddings, head or routers) stored quantized (inference).
    pub quant: Option<Quant>,
}

/// Every parameter tensor of an HF causal LM, as `model.parameters()` lists them.
pub struct Params {
    pub embed: T,
    /// GPT-2's learned positions.
    pub pos: Option<T>,
    pub layers: Vec<LayerParams>,
    pub final_norm: Vec<T>,
    /// The LM head's weight (the embedding when tied).
    pub head: T,
    /// Parameters that require grad (what the optimizer holds).
    pub all: Vec<T>,
    /// Bytes per element of dense parameters.
    pub es: u64,
    /// Per tape tensor id below `info.len()`: what the forward needs to know.
    pub info: Vec<ParamInfo>,
    /// Bytes of every parameter storage tensor (quantization state included).
    pub bytes: u64,
}

fn lora_base(l: &plan::setup::Lora) -> Result<(u64, Option<Quant>), PlanError> {
    match l.base {
        Dtype::F32 => Ok((4, None)),
        Dtype::Bf16 | Dtype::F16 => Ok((2, None)),
        // `prepare_model_for_kbit_training` upcasts every non-quantized parameter to fp32.
        // QLoRA's recipe: double-quantized absmax.
        Dtype::Nf4 => Ok((4, Some(Quant::Nf4 { double: true }))),
        Dtype::Int8 => Ok((4, Some(Quant::Int8))),
        other => Err(unsupported(&format!(
            "a {other:?} LoRA base (bitsandbytes stores nf4 or int8; use bf16, int8 or nf4)"
        ))),
    }
}

struct Builder<'a> {
    tape: &'a mut Tape,
    info: Vec<ParamInfo>,
    all: Vec<T>,
    bytes: u64,
    es: u64,
    frozen: bool,
}

impl Builder<'_> {
    fn register(&mut self, t: T, info: ParamInfo) {
        if info.trainable {
            self.all.push(t);
        } else {
            self.tape.freeze(t);
        }
        if self.info.len() <= t {
            self.info.resize(t + 1, ParamInfo::default());
        }
        self.info[t] = info;
    }

    fn storage(&mut self, bytes: u64) -> T {
        let t = self.tape.alloc(bytes, Category::Params);
        self.bytes += self.tape.tensors[t].bytes;
        t
    }

    fn dense(&mut self, numel: u64, es: u64, trainable: bool) -> T {
        let t = self.storage(numel * es);
        let info = ParamInfo {
            es,
            numel,
            trainable,
            quant: None,
            adapter: None,
        };
        self.register(t, info);
        t
    }

    fn plain(&mut self, numel: u64) -> T {
        self.dense(numel, self.es, !self.frozen)
    }

    /// A quantized weight: its first storage tensor stands for the parameter.
    fn quantized(&mut self, numel: u64, d_in: u64, q: Quant) -> T {
        let parts = quant_storage_bytes(numel, d_in, q);
        let t = self.storage(parts[0]);
        for &b in &parts[1..] {
            self.storage(b);
        }
        let info = ParamInfo {
            es: 2,
            numel,
            trainable: false,
            quant: Some(q),
            adapter: None,
        };
        self.register(t, info);
        t
    }
}

impl Params {
    pub fn build(tape: &mut Tape, m: &ModelShape, st: &Storage) -> Result<Params, PlanError> {
        let (es, lin_quant) = match &st.lora {
            Some(l) => lora_base(l)?,
            None => (st.es, st.quant),
        };
        let (lin_es, lin_quant) = match &st.lora {
            Some(l) if lin_quant.is_none() => (l.base.bits() / 8, None),
            _ => (es, lin_quant),
        };
        let mut b = Builder {
            tape,
            info: Vec::new(),
            all: Vec::new(),
            bytes: 0,
            es,
            frozen: st.lora.is_some(),
        };
        let h = m.d_model;
        let embed = b.plain(m.vocab * h);
        let pos = (m.family == Family::Gpt2).then(|| b.plain(m.max_positions * h));
        let mut layers = Vec::with_capacity(m.n_layers as usize);
        for l in 0..m.n_layers {
            let mut lp = LayerParams::default();
            for t in m.block_tensors(l) {
                let linear = t.kind == TensorKind::Linear;
                let id = match lin_quant {
                    Some(q) if linear => b.quantized(t.numel(), t.d_in, q),
                    _ if linear && st.lora.is_some() => b.dense(t.numel(), lin_es, false),
                    _ => b.plain(t.numel()),
                };
                if let Some(l) = &st.lora {
                    if plan::lora::is_target(&t, &l.targets) {
                        if t.count > 1 {
                            return Err(unsupported(
                                "LoRA on MoE experts (PEFT targets nn.Linear modules; HF keeps experts as 3-D parameters): target attention projections",
                            ));
                        }
                        let r = l.rank as u64;
                        let a = b.dense(r * t.d_in, 4, true);
                        let bb = b.dense(t.d_out * r, 4, true);
                        b.info[id].adapter = Some(Adapter { a, b: bb, rank: r });
                    }
                }
                lp.names.push(t.name);
                lp.t.push(id);
            }
            layers.push(lp);
        }
        let final_norm = if m.family == Family::Gpt2 {
            vec![b.plain(h), b.plain(h)]
        } else {
            vec![b.plain(h)]
        };
        let head = if m.tied_embeddings {
            embed
        } else {
            b.plain(m.vocab * h)
        };
        Ok(Params {
            embed,
            pos,
            layers,
            final_norm,
            head,
            all: b.all,
            es,
            info: b.info,
            bytes: b.bytes,
        })
    }

    pub fn bytes(&self, _tape: &Tape) -> u64 {
        self.bytes
    }
}

/// Token (and GPT-2 position) embeddings; returns the residual stream and RoPE's cos/sin.
pub fn embed(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, p: &Params) -> (V, Option<(V, V)>) {
    let out = embed_tokens(tape, f, m, p);
    if f.attention == plan::setup::Attention::Eager {
        // `create_causal_mask` for eager attention: a bool [B, 1, q, kv] mask turned into an
        // additive one in the embeddings' dtype, shared by every layer until the forward ends.
        let numel = f.batch * f.q_len * f.kv_len;
        let flags = alloc(tape, numel, 1);
        f.mask = Some(alloc(tape, numel, p.es));
        tape.drop(flags.t);
    }
    out
}

/// Drops the forward's eager attention mask, if it made one.
pub fn drop_mask(tape: &mut Tape, f: &mut Fwd) {
    if let Some(mask) = f.mask.take() {
        tape.drop(mask.t);
    }
}

fn embed_tokens(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, p: &Params) -> (V, Option<(V, V)>) {
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
            tape.drop_all(&[tok.t, pe.t]);
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
    tape.drop_all(&[lsm.t, shifted.t]);
    loss
}
