//! HF `generate`-style inference replayed on the tape: one prefill forward over `batch x seq`
//! tokens that fills a `DynamicCache`, then one decode step, both under `torch.no_grad()` with the
//! model in its own dtype (no autocast). Example: `simulate(&shape, &setup, Some(1))`.

use super::blocks::Fwd;
use super::model::{block, embed, head, Params, Storage};
use super::tape::Tape;
use super::unsupported;
use crate::setup::Dtype;
use crate::{Category, InferSetup, ModelShape, PlanError};

pub struct InferSim {
    pub tape: Tape,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub prefill_peak_bytes: u64,
    pub decode_peak_bytes: u64,
}

fn dtype_es(d: Dtype) -> Result<u64, PlanError> {
    match d {
        Dtype::F32 => Ok(4),
        Dtype::Bf16 | Dtype::F16 => Ok(2),
        other => Err(unsupported(&format!(
            "{other:?} weights or KV cache in plain HF transformers (needs a quantization \
             library); use f32, bf16 or f16"
        ))),
    }
}

/// Prefill over `setup.seq` tokens, then one decode token; `keep` is HF's `logits_to_keep`
/// (`Some(1)` as `generate` does, `None` for logits at every position).
pub fn simulate(
    m: &ModelShape,
    setup: &InferSetup,
    keep: Option<u64>,
) -> Result<InferSim, PlanError> {
    let es = dtype_es(setup.weights)?;
    if dtype_es(setup.kv_dtype)? != es {
        return Err(unsupported(
            "a KV cache dtype other than the weights' in HF's DynamicCache",
        ));
    }
    if setup.tp > 1 || setup.kv_block.is_some() {
        return Err(unsupported(
            "tensor parallelism or a paged KV cache (HF DynamicCache is contiguous)",
        ));
    }
    let mut tape = Tape::default();
    tape.no_record = true;
    let storage = Storage {
        es,
        lora: None,
        quant: None,
    };
    let params = Params::build(&mut tape, m, &storage)?;
    let weights_bytes = params.bytes(&tape);
    let mut f = Fwd {
        batch: setup.batch,
        q_len: setup.seq,
        kv_len: setup.seq,
        param_es: es,
        amp: false,
        training: false,
        dropout: false,
        attention: setup.attention,
        cast_cache: Default::default(),
        kv_cache: Vec::new(),
        use_cache: true,
        params: params.info.clone(),
    };
    let ids = tape.alloc(setup.batch * setup.seq * 8, Category::Other);
    tape.peak_bytes = tape.live_bytes;
    let logits = forward(&mut tape, &mut f, m, &params, keep);
    let prefill_peak_bytes = tape.peak_bytes;
    let kv_cache_bytes: u64 = f
        .kv_cache
        .iter()
        .map(|(k, v)| tape.tensors[k.t].bytes + tape.tensors[v.t].bytes)
        .sum();
    // Decode one token: the prefill's output (logits) is still held by the caller.
    let next = tape.alloc(setup.batch * 8, Category::Other);
    tape.peak_bytes = tape.live_bytes;
    f.q_len = 1;
    f.kv_len = setup.seq + 1;
    let logits2 = forward(&mut tape, &mut f, m, &params, Some(1));
    let decode_peak_bytes = tape.peak_bytes;
    for t in [logits, logits2, next, ids] {
        tape.drop(t);
    }
    Ok(InferSim {
        tape,
        weights_bytes,
        kv_cache_bytes,
        prefill_peak_bytes,
        decode_peak_bytes,
    })
}

fn forward(tape: &mut Tape, f: &mut Fwd, m: &ModelShape, p: &Params, keep: Option<u64>) -> usize {
    let (mut x, rope) = embed(tape, f, m, p);
    for l in 0..m.n_layers as usize {
        let y = block(tape, f, m, p, l, x, rope);
        tape.drop(x.t);
        x = y;
    }
    let (normed, logits) = head(tape, f, m, p, x, keep);
    tape.drop(x.t);
    tape.drop(normed.t);
    if let Some((cos, sin)) = rope {
        tape.drop(cos.t);
        tape.drop(sin.t);
    }
    logits.t
}
