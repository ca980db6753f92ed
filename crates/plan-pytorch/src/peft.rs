//! LoRA as PEFT runs it and quantized linears as bitsandbytes runs them, on the [`Tape`].
//!
//! PEFT 0.21 `lora.Linear.forward`: `result = base_layer(x)`, then per adapter
//! `x = x.to(lora_A.weight.dtype)`, `result = result + lora_B(lora_A(dropout(x))) * scaling`,
//! `result.to(result_dtype)`. Adapters are fp32 (`autocast_adapter_dtype=True` upcasts 16-bit
//! ones), `lora_dropout` defaults to 0.0 (identity: no mask). The base is frozen, so its matmul
//! saves only the weight (autograd saves `x` only for the weight's gradient) — checked with
//! `saved_tensors_hooks` on CPU. bitsandbytes 0.50: `Linear4bit` casts the input to its compute
//! dtype (bf16), `MatMul4Bit` saves only the packed weight; on sm90 with more than a handful of
//! rows it dequantizes the weight to a bf16 temporary and calls `F.linear`, and dequantizes again
//! in backward. `Linear8bitLt` (threshold 6.0) quantizes the input row-wise (fp16 copy, int8 codes,
//! int32 accumulator), saves the input itself, and backward dequantizes `CB` to the input dtype.
//! Not here: LoRA on MoE experts, DoRA and other variants. Example:
//! `let y = frozen_quant_linear(&mut tape, x, Quant::Nf4 { double: true }, d_in, d_out)`.

use super::blocks::{add, alloc, cast, ew, linear, Fwd, V};
use super::tape::{Grad, Tape, T};
use plan::Category;

/// How a frozen linear weight is stored by a quantization library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// bitsandbytes `Params4bit` nf4, blocks of 64; `double`: the absmax double-quantized
    /// (QLoRA's recipe, `bnb_4bit_use_double_quant`), else an fp32 absmax per block.
    Nf4 { double: bool },
    /// bitsandbytes `Int8Params` (LLM.int8): int8 `CB` plus an fp32 `SCB` per output row.
    Int8,
    /// GPTQ/AWQ-style packed 4-bit weights, fp16 scales and zeros per group of `group` inputs,
    /// dequantized to fp16 per matmul (inference only).
    Int4 { group: u64 },
}

/// A LoRA adapter pair on a linear: `lora_A` (rank × d_in) and `lora_B` (d_out × rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adapter {
    pub a: T,
    pub b: T,
    pub rank: u64,
}

/// What the forward needs to know about one parameter tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamInfo {
    /// Bytes per element of the dense tensor (the compute dtype's for quantized storage).
    pub es: u64,
    pub numel: u64,
    pub trainable: bool,
    pub quant: Option<Quant>,
    pub adapter: Option<Adapter>,
}

/// Blocks of 64 per absmax, and 256 absmax values per second-level block (bitsandbytes defaults).
const NF4_BLOCK: u64 = 64;
const NESTED_BLOCK: u64 = 256;

/// The tensors bitsandbytes allocates for one quantized weight of `numel` elements in rows of
/// `d_in`, each a separate CUDA allocation: nf4 — packed codes, uint8 absmax, fp32 second-level
/// absmax, fp32 offset and the 16-entry nf4 code table; int8 — `CB` and `SCB`; int4 — packed
/// int32 codes, fp16 scales and packed zeros per group (AutoGPTQ's `qweight`, `scales`, `qzeros`).
pub fn quant_storage_bytes(numel: u64, d_in: u64, q: Quant) -> Vec<u64> {
    match q {
        Quant::Nf4 { double: true } => {
            let blocks = numel.div_ceil(NF4_BLOCK);
            vec![
                numel.div_ceil(2),
                blocks,
                4 * blocks.div_ceil(NESTED_BLOCK),
                4,
                16 * 4,
            ]
        }
        Quant::Nf4 { double: false } => {
            let blocks = numel.div_ceil(NF4_BLOCK);
            vec![numel.div_ceil(2), 4 * blocks, 16 * 4]
        }
        Quant::Int8 => vec![numel, 4 * (numel / d_in.max(1))],
        Quant::Int4 { group } => {
            let d_out = numel / d_in.max(1);
            let groups = d_in.div_ceil(group.max(1)) * d_out;
            vec![numel.div_ceil(2), 2 * groups, groups.div_ceil(2)]
        }
    }
}

/// A frozen quantized linear: bitsandbytes `Linear4bit` / `Linear8bitLt`, or a GPTQ-style
/// int4 kernel that dequantizes to fp16 (inference).
pub fn frozen_quant_linear(tape: &mut Tape, x: V, q: Quant, d_in: u64, d_out: u64) -> V {
    let rows = x.numel / d_in;
    match q {
        Quant::Nf4 { .. } | Quant::Int4 { .. } => {
            // `x.to(compute_dtype)`, then the dequantized weight and `F.linear`; `.to(inp_dtype)`.
            let xin = cast(tape, x, 2);
            // bitsandbytes' fused gemm (no temporary) serves at most 4 rows on sm90; GPTQ/AWQ
            // kernels dequantize tile by tile for decode-sized batches too.
            let dequant = rows > 4 || (!matches!(q, Quant::Nf4 { .. }) && rows > 16);
            let tmp = dequant.then(|| tape.alloc(d_in * d_out * 2, Category::Activations));
            let y = alloc(tape, rows * d_out, 2);
            if let Some(t) = tmp {
                tape.drop(t);
            }
            let op = tape.op(&[y.t]);
            tape.temps(op, &[d_in * d_out * 2]);
            tape.grads(op, &[Grad::New(xin.t)]);
            tape.drop(xin.t);
            let out = cast(tape, y, x.es);
            tape.drop(y.t);
            out
        }
        Quant::Int8 => {
            // int8_vectorwise_quant(A.to(fp16)): the fp16 copy, int8 codes and fp32 row scales;
            // int8_mixed_scaled_mm accumulates in int32 and writes A's dtype.
            let a16 = (x.es != 2).then(|| tape.alloc(rows * d_in * 2, Category::Activations));
            let ca = tape.alloc(rows * d_in, Category::Activations);
            let sca = tape.alloc(rows * 4, Category::Activations);
            if let Some(t) = a16 {
                tape.drop(t);
            }
            let acc = tape.alloc(rows * d_out * 4, Category::Activations);
            let y = alloc(tape, rows * d_out, x.es);
            for t in [acc, ca, sca] {
                tape.drop(t);
            }
            let op = tape.op(&[y.t]);
            tape.save(op, x.t);
            tape.temps(op, &[d_in * d_out * x.es]);
            tape.grads(op, &[Grad::New(x.t)]);
            y
        }
    }
}

/// PEFT's adapter branch added to the base output `base`: returns the layer's output.
pub fn lora_branch(tape: &mut Tape, f: &mut Fwd, x: V, base: V, ad: Adapter, d_in: u64) -> V {
    let d_out = base.numel / (x.numel / d_in);
    let a_es = f.info(ad.a).es;
    let xa = cast(tape, x, a_es);
    let a = linear(tape, f, xa, ad.a, d_in, ad.rank, None);
    tape.drop(xa.t);
    let b = linear(tape, f, a, ad.b, ad.rank, d_out, None);
    tape.drop(a.t);
    let scaled = ew(tape, b.numel, b.es, &[], &[b]); // * scaling (a Python float: nothing saved)
    tape.drop(b.t);
    let sum = add(tape, base, scaled);
    tape.drop(scaled.t);
    let out = cast(tape, sum, base.es); // result.to(torch_result_dtype)
    tape.drop(sum.t);
    out
}
