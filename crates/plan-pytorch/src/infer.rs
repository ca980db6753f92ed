//! HF `generate`-style inference replayed on the tape: one prefill forward over `batch x seq`
//! tokens that fills a `DynamicCache`, then one decode step, both under `torch.no_grad()` with the
//! model in its own dtype (no autocast). Quantized weights are stored as bitsandbytes (int8, nf4)
//! or GPTQ/AWQ (int4) store them; a TP rank holds its share of heads; a paged cache is a pool
//! of whole blocks. Example: `simulate(&shape, &setup, Some(1))`.

use super::blocks::{Fwd, V};
use super::model::{block, embed, head, Params, Storage};
use super::peft::Quant;
use super::tape::{round_512, Tape};
use super::unsupported;
use plan::setup::Dtype;
use plan::{Category, InferSetup, ModelShape, PlanError};

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
            "a {} KV cache in HF transformers (its QuantizedCache keeps int2/int4 through \
             quanto/HQQ with a 16-bit residual window; fp8 KV is a vLLM/TensorRT feature): use \
             --kv-dtype bf16 or fp16, or --runtime formula",
            format!("{other:?}").to_lowercase()
        ))),
    }
}

/// The weights' storage: dense, or block linears quantized as bitsandbytes (int8, nf4) or
/// GPTQ/AWQ (int4, fp16 scales and zeros per group, 128 by default) store them, with the rest
/// of the model in 16 bits.
fn weight_storage(setup: &InferSetup) -> Result<(u64, Option<Quant>), PlanError> {
    match setup.weights {
        Dtype::Int8 => Ok((2, Some(Quant::Int8))),
        Dtype::Nf4 => Ok((
            2,
            Some(Quant::Nf4 {
                double: setup.double_quant,
            }),
        )),
        Dtype::Int4 => Ok((
            2,
            Some(Quant::Int4 {
                group: setup.weight_group.unwrap_or(plan::infer::INT4_DEFAULT_GROUP),
            }),
        )),
        Dtype::Fp8 => Err(unsupported(
            "fp8 weights in HF transformers (FP8 checkpoints run through vLLM/TensorRT kernels); use bf16, int8, int4 or nf4",
        )),
        Dtype::Ggml => Err(unsupported(
            "ggml weights (a GGUF file's blocks as frugal's engine holds them): use --runtime \
             frugal, or bf16, int8, int4 or nf4",
        )),
        d => Ok((dtype_es(d)?, None)),
    }
}

/// One tensor-parallel rank's share of the model (Megatron/vLLM sharding): attention heads,
/// key/value heads, MLP and expert widths and the vocabulary divided by `tp`; MLA's latent
/// projections stay replicated.
fn tp_rank_shape(m: &ModelShape, tp: u32) -> ModelShape {
    let mut r = m.clone();
    if tp == 1 {
        return r;
    }
    let t = tp as u64;
    r.n_heads = m.n_heads / tp;
    r.n_kv_heads = if m.mla.is_some() {
        r.n_heads
    } else {
        (m.n_kv_heads / tp).max(1)
    };
    r.d_ff = m.d_ff.div_ceil(t);
    r.vocab = m.vocab.div_ceil(t);
    if let Some(moe) = r.moe.as_mut() {
        moe.d_ff_expert = moe.d_ff_expert.div_ceil(t);
    }
    r
}

/// Prefill over `setup.seq` tokens, then one decode token; `keep` is HF's `logits_to_keep`
/// (`Some(1)` as `generate` does, `None` for logits at every position). With `tp > 1` this is
/// one rank, whose row-parallel outputs are all-reduced out of place (one hidden-state buffer
/// per call); with `kv_block` the cache is a paged pool of whole blocks written in place
/// (vLLM's layout) instead of `DynamicCache`'s concatenation.
pub fn simulate(
    m: &ModelShape,
    setup: &InferSetup,
    keep: Option<u64>,
) -> Result<InferSim, PlanError> {
    setup.validate(m)?;
    let (es, quant) = weight_storage(setup)?;
    if dtype_es(setup.kv_dtype)? != es {
        return Err(unsupported(
            "a KV cache dtype other than the activations' in HF's DynamicCache",
        ));
    }
    let rank = tp_rank_shape(m, setup.tp);
    let m = &rank;
    let mut tape = Tape::default();
    tape.no_record = true;
    let storage = Storage {
        es,
        lora: None,
        quant,
    };
    let params = Params::build(&mut tape, m, &storage)?;
    let weights_bytes = params.bytes(&tape);
    let mut f = Fwd {
        batch: setup.batch,
        q_len: setup.seq,
        kv_len: setup.seq,
        param_es: es,
        amp: false,
        fp16: setup.weights == Dtype::F16,
        training: false,
        dropout: false,
        attention: setup.attention,
        cast_cache: Default::default(),
        kv_cache: Vec::new(),
        use_cache: true,
        params: params.info.clone(),
        kv_block: setup.kv_block.map(|b| (b, setup.seq + 1)),
        window: m.sliding_window,
        mask: None,
    };
    let ids = tape.alloc(setup.batch * setup.seq * 8, Category::Other);
    if setup.tp > 1 {
        tape.alloc(setup.batch * setup.seq * m.d_model * es, Category::Other);
    }
    tape.peak_bytes = tape.live_bytes;
    let logits = forward(&mut tape, &mut f, m, &params, keep);
    let prefill_peak_bytes = tape.peak_bytes;
    // What the cache holds from here on: a sliding layer's view of its last positions (the
    // prefill's full storage behind it goes at the first decode step's concatenation).
    let views = m.sliding_window.is_some() && setup.kv_block.is_none();
    let held = |x: &V| {
        let storage = tape.tensors[x.t].bytes;
        if views {
            storage.min(round_512(x.numel * x.es))
        } else {
            storage
        }
    };
    let kv_cache_bytes: u64 = f.kv_cache.iter().map(|(k, v)| held(k) + held(v)).sum();
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
    tape.drop_all(&[x.t, normed.t]);
    if let Some((cos, sin)) = rope {
        tape.drop_all(&[cos.t, sin.t]);
    }
    super::model::drop_mask(tape, f);
    logits.t
}
