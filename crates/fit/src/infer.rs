//! The inference advisor (`frugal fit --infer`): which weight format, KV-cache format, tensor
//! parallel degree or weight offload let a model serve a batch at a context on the GPUs given,
//! the largest batch and the longest context each of them holds, and how fast it decodes.
//!
//! Memory is the `formula` runtime's inference estimate ([`plan::infer`]): weights in their
//! format with scales, the KV cache (sliding windows honoured), the larger of the prefill's and a
//! decode step's activations, the CUDA context. A candidate fits when that total is at most the
//! device's capacity less the headroom. Weight offload keeps the weights in host memory and
//! streams them unit by unit over the host link (two units resident, double-buffered), as
//! accelerate's `device_map` offload and llama.cpp's partial offload do.
//!
//! Speed: decode is memory-bound; a step reads this rank's weights and the batch's KV cache at
//! [`DECODE_BANDWIDTH_EFFICIENCY`] × the HBM bandwidth (offloaded weights at the host link's),
//! or computes 2 FLOPs per active parameter and row at peak × MFU, whichever is slower, plus two
//! all-reduces per layer under TP at [`ALLREDUCE_LATENCY_S`] each. Prefill computes 2 FLOPs per
//! active parameter per token plus causal attention at peak × MFU. These are modelled, not
//! measured. Pure: no IO. Example: `advise(&shape, &InferRequest::new(1, 4096, 1, 24 << 30))`.

use super::check::{check_machine, invalid};
use super::hardware::{Hardware, GPUS};
use plan::infer::{inference_estimate, InferEstimate};
use plan::setup::{Attention, Dtype, InferSetup};
use plan::{ModelShape, PlanError};
use serde::Serialize;

mod speed;
pub use speed::speed;

/// Fraction of the HBM bandwidth a decode step's reads reach (vLLM and TensorRT-LLM decode
/// kernels reach roughly 70-85% on H100s; an assumption, not a measurement).
pub const DECODE_BANDWIDTH_EFFICIENCY: f64 = 0.8;

/// Latency of one small all-reduce over NVLink (NCCL's ring for a few KB; an assumption).
pub const ALLREDUCE_LATENCY_S: f64 = 10e-6;

/// Weight formats tried, highest fidelity first (the order breaks speed ties).
pub const WEIGHT_FORMATS: [(Dtype, Option<u64>); 5] = [
    (Dtype::Bf16, None),
    (Dtype::Fp8, None),
    (Dtype::Int8, None),
    (Dtype::Int4, Some(128)),
    (Dtype::Nf4, Some(64)),
];

/// KV-cache formats tried, highest fidelity first.
pub const KV_FORMATS: [Dtype; 3] = [Dtype::Bf16, Dtype::Fp8, Dtype::Int8];

/// What the user asks `fit --infer`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InferRequest {
    /// Concurrent sequences.
    pub batch: u64,
    /// Context per sequence: prompt plus generated tokens.
    pub seq: u64,
    /// GPUs available: tensor-parallel degrees up to this (inside one node) are tried.
    pub gpus: u32,
    pub capacity_bytes: u64,
    /// Fraction of the capacity kept free (allocator fragmentation, other processes).
    pub headroom: f64,
    /// Host memory for offloaded weights (`None`: not limited).
    pub host_bytes: Option<u64>,
    pub hardware: Hardware,
    /// Only this weight format / KV format (the user pinned it).
    pub weights: Option<Dtype>,
    pub kv_dtype: Option<Dtype>,
    /// A GGUF file's own tensors (`None` for other models): its `ggml` format is weighed first,
    /// at the file's bytes.
    pub ggml_file: Option<GgmlFile>,
}

/// A GGUF file's weights as it holds them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GgmlFile {
    /// Every tensor's bytes in its own type.
    pub bytes: u64,
    /// Its smallest scale group (32; 16 with Q6_K).
    pub group: u64,
}

impl InferRequest {
    /// bf16-capable H100s, 5% headroom, every format, unlimited host memory.
    pub fn new(batch: u64, seq: u64, gpus: u32, capacity_bytes: u64) -> InferRequest {
        InferRequest {
            batch,
            seq,
            gpus,
            capacity_bytes,
            headroom: 0.05,
            host_bytes: None,
            hardware: Hardware::of(GPUS[0]),
            weights: None,
            kv_dtype: None,
            ggml_file: None,
        }
    }

    /// Bytes a candidate may use per device.
    pub fn usable_bytes(&self) -> u64 {
        (self.capacity_bytes as f64 * (1.0 - self.headroom)) as u64
    }
}

/// One way to serve the model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Serving {
    pub weights: Dtype,
    pub weight_group: Option<u64>,
    pub kv_dtype: Dtype,
    pub tp: u32,
    /// Weights in host memory, streamed to the device per block.
    pub offload: bool,
}

/// Speed of a candidate at the request's batch and context.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct InferSpeed {
    /// Tokens per second over the batch (batch ÷ step time).
    pub decode_tokens_per_s: f64,
    pub decode_step_s: f64,
    /// Time to prefill every sequence's whole context once.
    pub prefill_s: f64,
    /// "memory" (weights and KV reads), "host link" (offloaded weights) or "compute".
    pub bound: &'static str,
}

/// One weighed candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InferChoice {
    pub serving: Serving,
    /// Per device at the request's batch and context.
    pub total_bytes: u64,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Host memory the offloaded weights need (0 without offload).
    pub host_bytes: u64,
    pub fits: bool,
    /// Most sequences that fit at the request's context (0: not even one).
    pub max_batch: u64,
    /// Longest context that fits at the request's batch (0: not even one token), at most the
    /// model's positions.
    pub max_seq: u64,
    pub speed: InferSpeed,
}

/// What the advisor found.
#[derive(Clone, Debug, Serialize)]
pub struct InferAdvice {
    /// Candidates that fit, fastest first.
    pub fitting: Vec<InferChoice>,
    /// Those that do not, smallest total first.
    pub too_big: Vec<InferChoice>,
    /// With more GPUs than given: the fewest that serve the request without offload, and how.
    pub more_gpus: Option<InferChoice>,
    pub candidates_weighed: usize,
}

impl InferAdvice {
    pub fn best(&self) -> Option<&InferChoice> {
        self.fitting.first()
    }
}

fn setup_of(r: &InferRequest, s: &Serving, batch: u64, seq: u64) -> InferSetup {
    InferSetup {
        ggml_nibbles: plan_frugal::Roles::NONE,
        ggml_file_bytes: r
            .ggml_file
            .filter(|_| s.weights == Dtype::Ggml)
            .map(|f| f.bytes),
        weights: s.weights,
        weight_group: s.weight_group,
        double_quant: false,
        kv_dtype: s.kv_dtype,
        batch,
        seq,
        kv_block: None,
        tp: s.tp,
        attention: Attention::Flash,
    }
}

/// Device and host bytes of `s` serving `batch` sequences of `seq` tokens.
fn memory(
    model: &ModelShape,
    r: &InferRequest,
    s: &Serving,
    batch: u64,
    seq: u64,
) -> Result<(InferEstimate, u64, u64), PlanError> {
    let e = inference_estimate(model, &setup_of(r, s, batch, seq))?;
    let total = e.total_bytes();
    if !s.offload {
        return Ok((e, total, 0));
    }
    // Two units resident (the one running and the next arriving): the largest of a block, the
    // embedding and the head.
    let one = setup_of(r, s, 1, 1);
    let largest = plan::infer::largest_block_weight_bytes(model, &one)
        .max(plan::infer::tensors_bytes(&model.embedding_tensors(), &one))
        .max(plan::infer::tensors_bytes(&model.head_tensors(), &one));
    // A GGUF file's units in proportion to its bytes against the generic ggml estimate.
    let largest = match one.ggml_file_bytes {
        Some(file) => {
            let generic = InferSetup {
                ggml_file_bytes: None,
                ..one.clone()
            };
            let all = plan::infer::model_weight_bytes(model, &generic).max(1);
            (largest as u128 * file.div_ceil(s.tp.max(1) as u64) as u128 / all as u128) as u64
        }
        None => largest,
    };
    let device = total - e.weights_bytes + (2 * largest).min(e.weights_bytes);
    let host = e.weights_bytes;
    Ok((e, device, host))
}

fn fits(r: &InferRequest, device: u64, host: u64) -> bool {
    device <= r.usable_bytes() && r.host_bytes.is_none_or(|h| host <= h)
}

/// The largest `x` in `1..=hi` for which `ok(x)`, assuming `ok` is monotone (0 if none).
fn largest(hi: u64, ok: impl Fn(u64) -> bool) -> u64 {
    if !ok(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Weighs `s` for the request.
fn weigh(model: &ModelShape, r: &InferRequest, s: Serving) -> Result<InferChoice, PlanError> {
    let (e, device, host) = memory(model, r, &s, r.batch, r.seq)?;
    let ok_at = |batch: u64, seq: u64| {
        memory(model, r, &s, batch, seq).is_ok_and(|(_, d, h)| fits(r, d, h))
    };
    let max_batch = largest(1 << 24, |b| ok_at(b, r.seq));
    let max_seq = largest(model.max_positions, |t| ok_at(r.batch, t));
    Ok(InferChoice {
        serving: s,
        total_bytes: device,
        weights_bytes: e.weights_bytes,
        kv_cache_bytes: e.kv_cache_bytes,
        host_bytes: host,
        fits: fits(r, device, host),
        max_batch,
        max_seq,
        speed: speed(model, &s, r.batch, r.seq, &r.hardware, &e),
    })
}

/// Tensor-parallel degrees of at most `gpus` that `model`'s heads allow inside a node.
fn tp_degrees(model: &ModelShape, gpus: u32, per_node: u32) -> Vec<u32> {
    (1..=gpus.min(per_node))
        .filter(|&t| {
            gpus % t == 0
                && model.n_heads % t == 0
                && (model.mla.is_some() || model.n_kv_heads % t == 0)
        })
        .collect()
}

/// The format's usual group `g`, else the widest smaller one (64, 32) that divides every linear
/// input; `None` when none does.
fn group_for(model: &ModelShape, g: u64) -> Option<u64> {
    let fits = |g: &u64| plan::validate::check_groups(model, *g).is_ok();
    [g, 64, 32].into_iter().filter(|x| *x <= g).find(fits)
}

fn candidates(model: &ModelShape, r: &InferRequest, gpus: u32, offload: &[bool]) -> Vec<Serving> {
    let mut out = Vec::new();
    // A GGUF file's own blocks first, then the formats it could be requantized to.
    let own = r.ggml_file.map(|f| (Dtype::Ggml, Some(f.group)));
    for tp in tp_degrees(model, gpus, r.hardware.gpus_per_node) {
        for &(weights, group) in own.iter().chain(&WEIGHT_FORMATS) {
            if r.weights.is_some_and(|w| w != weights) {
                continue;
            }
            let weight_group = match group {
                // The file's own group, or no such candidate when it cannot run as one.
                Some(g) if weights == Dtype::Ggml => match plan::validate::check_groups(model, g) {
                    Ok(()) => Some(g),
                    Err(_) => continue,
                },
                Some(g) => match group_for(model, g) {
                    Some(g) => Some(g),
                    None => continue,
                },
                None => None,
            };
            for &kv_dtype in &KV_FORMATS {
                if r.kv_dtype.is_some_and(|k| k != kv_dtype) {
                    continue;
                }
                for &offload in offload {
                    out.push(Serving {
                        weights,
                        weight_group,
                        kv_dtype,
                        tp,
                        offload,
                    });
                }
            }
        }
    }
    out
}

fn fidelity(s: &Serving) -> (usize, usize) {
    // A GGUF file's own values rank above any requantization of them.
    let w = match s.weights {
        Dtype::Ggml => 0,
        w => {
            1 + WEIGHT_FORMATS
                .iter()
                .position(|(d, _)| *d == w)
                .unwrap_or(9)
        }
    };
    let k = KV_FORMATS
        .iter()
        .position(|d| *d == s.kv_dtype)
        .unwrap_or(9);
    (w, k)
}

/// Checks the request; errors name the flag and the fix.
pub fn check(model: &ModelShape, r: &InferRequest) -> Result<(), PlanError> {
    check_machine(model, &r.hardware, r.gpus, r.capacity_bytes, "24GiB")?;
    if r.batch == 0 {
        return Err(invalid("--batch", "must be at least 1 sequence".into()));
    }
    if r.seq == 0 || r.seq > model.max_positions {
        return Err(invalid(
            "--seq",
            format!("must be 1 to the model's {} positions", model.max_positions),
        ));
    }
    if !(0.0..1.0).contains(&r.headroom) {
        return Err(invalid(
            "--headroom",
            "must be a fraction in [0, 1): e.g. 0.05".into(),
        ));
    }
    if r.kv_dtype.is_some_and(|k| !KV_FORMATS.contains(&k)) {
        return Err(invalid("--kv-dtype", "use bf16, fp8 or int8".into()));
    }
    if r.weights == Some(Dtype::Ggml) && r.ggml_file.is_none() {
        return Err(invalid(
            "--weights",
            "ggml is a quantized GGUF file's own blocks, and --model is not one whose tensors \
             could be weighed (a pasted config, or a GGUF file of floats): pass a quantized \
             GGUF file as --model, or use bf16, fp8, int8, int4 or nf4"
                .into(),
        ));
    }
    if r.weights
        .is_some_and(|w| w != Dtype::Ggml && !WEIGHT_FORMATS.iter().any(|(d, _)| *d == w))
    {
        return Err(invalid(
            "--weights",
            "use bf16, fp8, int8, int4 or nf4 (or ggml for a GGUF file)".into(),
        ));
    }
    let grouped = WEIGHT_FORMATS
        .iter()
        .filter(|(d, g)| Some(*d) == r.weights && g.is_some());
    if let Some((d, Some(g))) = grouped.clone().next() {
        if group_for(model, *g).is_none() {
            return Err(invalid(
                "--weights",
                format!(
                    "{} groups of 32, 64 or {g} do not divide every linear input of the model: \
                     use int8 or bf16",
                    d
                ),
            ));
        }
    }
    if tp_degrees(model, r.gpus, r.hardware.gpus_per_node).is_empty() {
        return Err(invalid(
            "--gpus",
            format!(
                "no tensor-parallel degree of {} GPUs divides {}'s heads",
                r.gpus, model.name
            ),
        ));
    }
    Ok(())
}

/// Weighs every candidate and ranks those that fit: on the device before offloaded, a GGUF
/// file's own blocks first, then fastest decode, then higher-fidelity formats, then fewer GPUs.
pub fn advise(model: &ModelShape, r: &InferRequest) -> Result<InferAdvice, PlanError> {
    check(model, r)?;
    let all = candidates(model, r, r.gpus, &[false, true]);
    let n = all.len();
    let (mut fitting, mut too_big) = (Vec::new(), Vec::new());
    for s in all {
        let c = weigh(model, r, s)?;
        if c.fits {
            fitting.push(c);
        } else {
            too_big.push(c);
        }
    }
    // On the device before offloaded, and there a GGUF file's own blocks first: requantizing
    // them rounds twice.
    let own = |c: &InferChoice| (c.serving.offload, c.serving.weights != Dtype::Ggml);
    fitting.sort_by(|a, b| {
        own(a)
            .cmp(&own(b))
            .then(
                b.speed
                    .decode_tokens_per_s
                    .total_cmp(&a.speed.decode_tokens_per_s),
            )
            .then(fidelity(&a.serving).cmp(&fidelity(&b.serving)))
            .then(a.serving.tp.cmp(&b.serving.tp))
    });
    too_big.sort_by_key(|c| c.total_bytes);
    let more_gpus = if fitting.first().is_none_or(|c| c.serving.offload) {
        more_gpus(model, r)?
    } else {
        None
    };
    Ok(InferAdvice {
        fitting,
        too_big,
        more_gpus,
        candidates_weighed: n,
    })
}

/// The fewest GPUs past the request's (inside one node) that serve it without offload, with
/// their fastest candidate.
fn more_gpus(model: &ModelShape, r: &InferRequest) -> Result<Option<InferChoice>, PlanError> {
    for gpus in (r.gpus + 1)..=r.hardware.gpus_per_node {
        let more = InferRequest { gpus, ..r.clone() };
        let mut best: Option<InferChoice> = None;
        for s in candidates(model, &more, gpus, &[false]) {
            if s.tp != gpus {
                continue;
            }
            let c = weigh(model, &more, s)?;
            let faster = best
                .as_ref()
                .is_none_or(|b| c.speed.decode_tokens_per_s > b.speed.decode_tokens_per_s);
            if c.fits && faster {
                best = Some(c);
            }
        }
        if best.is_some() {
            return Ok(best);
        }
    }
    Ok(None)
}
