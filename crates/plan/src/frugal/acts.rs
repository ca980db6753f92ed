//! Activation buffers of one micro-step, llm.c style: what each block saves for its backward, the
//! gradient-of-activation scratch, the fused classifier's chunk scratch and the token batch.
//!
//! Names are stable: the engine asks its arena for `act.h.3.qkv` and gets the very buffer listed
//! here, so the sizes below ARE the engine's allocation sizes. Lifetimes follow the step timeline:
//! block `l` saves its tensors in `Forward(l)` and frees them after `Backward(l)`; its output is the
//! next block's input and lives until `Backward(l + 1)` (or the head). Gradient scratch is shared
//! by all blocks and lives over the whole backward pass. This module does not decide offsets
//! (see `layout`) nor parameter buffers (see `units`).
//!
//! Example: GPT-2 tiny at batch 2, seq 8 saves `act.h.0.att` of 2·NH·8·8 f32.

use crate::buffer::{Buffer, Category, Device, Lifetime, Phase};
use crate::model::Family;
use crate::ModelShape;

/// Rows of logits the fused classifier materialises at a time: enough rows for both cores to
/// share a GEMM, few enough that chunk × V stays a few MiB even for a 128k vocabulary.
pub const CLASSIFIER_CHUNK_ROWS: u64 = 64;

/// The sizes the activation plan depends on.
#[derive(Clone, Copy, Debug)]
pub struct ActShape {
    pub batch: u64,
    pub seq: u64,
}

/// Element counts of one block's saved tensors and of the backward scratch.
#[derive(Clone, Copy, Debug)]
pub struct BlockDims {
    /// Rows: batch × seq.
    pub n: u64,
    pub c: u64,
    /// Width of the fused q|k|v row: (NH + 2 NKV) HD.
    pub qkv: u64,
    /// Width of the attention output: NH HD.
    pub atty: u64,
    /// Width of the MLP's first matmul output: 4C (GPT-2) or 2F (Llama gate|up).
    pub fc: u64,
    /// Width of the MLP's activation output: F.
    pub fc_act: u64,
    /// Elements of the attention probabilities: B NH T T.
    pub att: u64,
    /// Whether norms keep a mean (LayerNorm) besides the reciprocal std.
    pub has_mean: bool,
}

impl BlockDims {
    pub fn new(m: &ModelShape, s: ActShape) -> BlockDims {
        let n = s.batch * s.seq;
        let atty = u64::from(m.n_heads) * m.d_head;
        let qkv = atty + 2 * u64::from(m.n_kv_heads) * m.d_head;
        let gpt2 = m.family == Family::Gpt2;
        BlockDims {
            n,
            c: m.d_model,
            qkv,
            atty,
            fc: if gpt2 { m.d_ff } else { 2 * m.d_ff },
            fc_act: m.d_ff,
            att: s.batch * u64::from(m.n_heads) * s.seq * s.seq,
            has_mean: gpt2,
        }
    }
}

/// Names of one block's saved activations, in the order the forward pass writes them.
pub fn block_act_names(layer: u32) -> BlockActNames {
    let p = |s: &str| format!("act.h.{layer}.{s}");
    BlockActNames {
        ln1: p("ln1"),
        ln1_mean: p("ln1_mean"),
        ln1_rstd: p("ln1_rstd"),
        qkv: p("qkv"),
        att: p("att"),
        atty: p("atty"),
        res2: p("res2"),
        ln2: p("ln2"),
        ln2_mean: p("ln2_mean"),
        ln2_rstd: p("ln2_rstd"),
        fch: p("fch"),
        fch_act: p("fch_act"),
        out: p("out"),
    }
}

/// Buffer names of a block's saved tensors (see [`block_act_names`]).
#[derive(Clone, Debug)]
pub struct BlockActNames {
    pub ln1: String,
    pub ln1_mean: String,
    pub ln1_rstd: String,
    pub qkv: String,
    pub att: String,
    pub atty: String,
    pub res2: String,
    pub ln2: String,
    pub ln2_mean: String,
    pub ln2_rstd: String,
    pub fch: String,
    pub fch_act: String,
    /// The block's output (the residual stream after it).
    pub out: String,
}

fn span(born: Phase, dies: Phase) -> Lifetime {
    Lifetime::Span { born, dies }
}

fn f32_buffer(name: &str, category: Category, numel: u64, lifetime: Lifetime) -> Buffer {
    Buffer {
        name: name.into(),
        category,
        device: Device::Gpu,
        bytes: 4 * numel,
        lifetime,
    }
}

/// Every activation-side buffer of one micro-step, on the device.
pub fn activation_buffers(m: &ModelShape, s: ActShape) -> Vec<Buffer> {
    let d = BlockDims::new(m, s);
    let act = Category::Activations;
    let last = m.n_layers - 1;
    let mut out = vec![
        // Token ids are u32: the same 4 bytes as an f32.
        f32_buffer("batch.tokens", act, d.n, Lifetime::Persistent),
        f32_buffer("batch.targets", act, d.n, Lifetime::Persistent),
        f32_buffer(
            "act.encoded",
            act,
            d.n * d.c,
            span(Phase::Embed, Phase::Backward(0)),
        ),
    ];
    for layer in 0..m.n_layers {
        let names = block_act_names(layer);
        let life = span(Phase::Forward(layer), Phase::Backward(layer));
        let mut saved = vec![
            (&names.ln1, d.n * d.c),
            (&names.ln1_rstd, d.n),
            (&names.qkv, d.n * d.qkv),
            (&names.att, d.att),
            (&names.atty, d.n * d.atty),
            (&names.res2, d.n * d.c),
            (&names.ln2, d.n * d.c),
            (&names.ln2_rstd, d.n),
            (&names.fch, d.n * d.fc),
            (&names.fch_act, d.n * d.fc_act),
        ];
        if d.has_mean {
            saved.push((&names.ln1_mean, d.n));
            saved.push((&names.ln2_mean, d.n));
        }
        out.extend(saved.into_iter().map(|(n, e)| f32_buffer(n, act, e, life)));
        // The block output feeds the next block, whose norm backward reads it.
        let dies = if layer == last {
            Phase::Head
        } else {
            Phase::Backward(layer + 1)
        };
        out.push(f32_buffer(
            &names.out,
            act,
            d.n * d.c,
            span(Phase::Forward(layer), dies),
        ));
    }
    out.extend(head_buffers(m, &d));
    out.extend(backward_scratch(m, &d));
    out
}

/// The head's forward-and-backward buffers: final norm, losses, its input gradient, the
/// classifier's chunk of logits.
fn head_buffers(m: &ModelShape, d: &BlockDims) -> Vec<Buffer> {
    let act = Category::Activations;
    let head = span(Phase::Head, Phase::Head);
    let chunk_rows = CLASSIFIER_CHUNK_ROWS.min(d.n);
    let mut out = vec![
        f32_buffer("act.lnf", act, d.n * d.c, head),
        f32_buffer("act.lnf_rstd", act, d.n, head),
        f32_buffer("act.losses", act, d.n, head),
        f32_buffer("dact.lnf", act, d.n * d.c, head),
        f32_buffer(
            "work.classifier",
            Category::Other,
            chunk_rows * m.vocab,
            head,
        ),
        // The residual stream's gradient, from the head down to the embedding.
        f32_buffer(
            "dact.residual",
            act,
            d.n * d.c,
            span(Phase::Head, Phase::EmbedBackward),
        ),
    ];
    if d.has_mean {
        out.push(f32_buffer("act.lnf_mean", act, d.n, head));
    }
    out
}

/// Gradient-of-activation scratch shared by every block's backward (zeroed before each use).
fn backward_scratch(m: &ModelShape, d: &BlockDims) -> Vec<Buffer> {
    let act = Category::Activations;
    let life = span(Phase::Backward(m.n_layers - 1), Phase::Backward(0));
    [
        ("dact.ln", d.n * d.c),
        ("dact.qkv", d.n * d.qkv),
        ("dact.att", d.att),
        ("dact.atty", d.n * d.atty),
        ("dact.fch", d.n * d.fc),
        ("dact.fch_act", d.n * d.fc_act),
    ]
    .into_iter()
    .map(|(n, e)| f32_buffer(n, act, e, life))
    .collect()
}
