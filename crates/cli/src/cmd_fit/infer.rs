//! `frugal fit --infer`'s output: the serving setups that fit, the largest batch and context of
//! each, decode tokens/s and prefill time, and what more GPUs would buy; `--json` as one object.
//!
//! Not here: the search (`fit::infer`). Example: `print!("{}", text(&model, &r, &advice, 5))`.

use super::render::secs;
use fit::dtype_name;
use fit::infer::{InferAdvice, InferChoice, InferRequest, Serving};
use plan::ModelShape;
use serde_json::{json, Value};
use term::{gigabytes, human_bytes, Table};

/// The `frugal plan --infer` flags of `s` at `batch` × `seq`.
pub fn plan_command(model: &str, s: &Serving, batch: u64, seq: u64) -> String {
    // (ggml takes the file's own group.)
    let group = s
        .weight_group
        .filter(|_| s.weights != plan::setup::Dtype::Ggml)
        .map_or(String::new(), |g| format!(" --weight-group {g}"));
    format!(
        "frugal plan --model {model} --infer --runtime formula --weights {}{group} --kv-dtype {} --tp {} --batch {batch} --seq {seq}",
        dtype_name(s.weights),
        dtype_name(s.kv_dtype),
        s.tp
    )
}

fn label(s: &Serving) -> String {
    let group = s.weight_group.map_or(String::new(), |g| format!("/g{g}"));
    format!("{}{group}", dtype_name(s.weights))
}

fn table(choices: &[&InferChoice], r: &InferRequest) -> String {
    let mut t = Table::new(&[
        "#",
        "weights",
        "kv",
        "tp",
        "offload",
        "total",
        "headroom",
        "max batch",
        "max context",
        "decode tok/s",
        "prefill",
        "bound",
    ]);
    for (i, c) in choices.iter().enumerate() {
        let s = &c.serving;
        t.row(vec![
            (i + 1).to_string(),
            label(s),
            dtype_name(s.kv_dtype).into(),
            s.tp.to_string(),
            if s.offload { "weights" } else { "-" }.into(),
            human_bytes(c.total_bytes),
            human_bytes(r.capacity_bytes.saturating_sub(c.total_bytes)),
            format!("{} @ {}", c.max_batch, r.seq),
            format!("{} @ {}", c.max_seq, r.batch),
            format!("{:.1}", c.speed.decode_tokens_per_s),
            secs(c.speed.prefill_s),
            c.speed.bound.into(),
        ]);
    }
    t.render()
}

pub fn text(
    model: &ModelShape,
    r: &InferRequest,
    a: &InferAdvice,
    top: usize,
    gpu_note: Option<String>,
) -> String {
    let hw = &r.hardware;
    let mut out = format!(
        "{} ({} parameters) serving {} x {} tokens on up to {} x {} with {} each ({}), {:.0}% headroom\n\
         decode: weights + KV reads at {:.0}% of {:.2} TB/s, or 2 FLOPs per active parameter at {:.0} TFLOP/s x MFU {:.2}\n\
         {}weighed {} candidates: {} fit\n\n",
        model.name,
        term::group_digits(model.param_count()),
        r.batch,
        r.seq,
        r.gpus,
        hw.gpu.name,
        human_bytes(r.capacity_bytes),
        gigabytes(r.capacity_bytes),
        r.headroom * 100.0,
        fit::infer::DECODE_BANDWIDTH_EFFICIENCY * 100.0,
        hw.gpu.hbm_bytes_per_s / 1e12,
        hw.gpu.bf16_flops / 1e12,
        hw.mfu,
        gpu_note.map_or(String::new(), |n| format!("{n}\n")),
        a.candidates_weighed,
        a.fitting.len(),
    );
    if a.fitting.is_empty() {
        out.push_str("nothing fits.\n");
        if let Some(c) = a.too_big.first() {
            out.push_str(&format!(
                "closest: {} weights, {} KV, tp {}{}: {} > {} usable\n",
                label(&c.serving),
                dtype_name(c.serving.kv_dtype),
                c.serving.tp,
                if c.serving.offload {
                    ", weights offloaded"
                } else {
                    ""
                },
                human_bytes(c.total_bytes),
                human_bytes(r.usable_bytes())
            ));
        }
    } else {
        let shown: Vec<&InferChoice> = a.fitting.iter().take(top).collect();
        out.push_str("fastest setups that fit (total per GPU; GiB = 2^30 bytes):\n");
        out.push_str(&table(&shown, r));
        let best = shown[0];
        if best.serving.offload {
            out.push_str(&format!(
                "#1 streams {} of weights from host memory each step\n",
                human_bytes(best.host_bytes)
            ));
        }
        let note = if best.serving.offload {
            " (plans the weights on the device: plan does not model offload)"
        } else {
            ""
        };
        out.push_str(&format!(
            "plan it: {}{note}\n",
            plan_command(&model.name, &best.serving, r.batch, r.seq)
        ));
    }
    if let Some(c) = &a.more_gpus {
        out.push_str(&format!(
            "with {} GPUs: {} weights, {} KV, --tp {} fits without offload ({} per GPU, {:.1} tokens/s)\n",
            c.serving.tp,
            label(&c.serving),
            dtype_name(c.serving.kv_dtype),
            c.serving.tp,
            human_bytes(c.total_bytes),
            c.speed.decode_tokens_per_s
        ));
    }
    out
}

fn choice_json(model: &ModelShape, r: &InferRequest, c: &InferChoice) -> Value {
    let mut v = serde_json::to_value(c).unwrap_or_default();
    v["plan_command"] = json!(plan_command(&model.name, &c.serving, r.batch, r.seq));
    v
}

pub fn to_json(
    model: &ModelShape,
    r: &InferRequest,
    a: &InferAdvice,
    top: usize,
    gpu_note: Option<String>,
) -> Value {
    json!({
        "gpu_note": gpu_note,
        "model": model.name,
        "param_count": model.param_count(),
        "request": r,
        "usable_bytes": r.usable_bytes(),
        "candidates_weighed": a.candidates_weighed,
        "fitting_count": a.fitting.len(),
        "best": a.fitting.iter().take(top).map(|c| choice_json(model, r, c)).collect::<Vec<_>>(),
        "closest_too_big": a.too_big.first().map(|c| choice_json(model, r, c)),
        "more_gpus": a.more_gpus.as_ref().map(|c| choice_json(model, r, c)),
    })
}
