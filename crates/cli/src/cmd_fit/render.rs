//! `frugal fit`'s output: the table of the best setups, the remedies they apply, why the
//! rest don't fit, and the `--json` object (docs/cli.md's `per_device` for each setup shown).
//!
//! Not here: flags and the search. Example: `print!("{}", text(&model, &r, &res, &misses, &u, 5))`.

use fit::report::{self, PerDevice};
use fit::{self, remedy, FitRequest, FitResult, Weighed};
use plan::setup::{Attention, TrainSetup};
use plan::ModelShape;
use serde_json::{json, Value};
use term::{gigabytes, human_bytes, Table};

/// `per_device` (its fields: docs/cli.md) and `host` of a candidate, re-estimated for the report.
fn per_device(
    model: &ModelShape,
    r: &FitRequest,
    s: &TrainSetup,
) -> (PerDevice, Option<report::Host>) {
    let est = r
        .runtime
        .estimate(model, s)
        .expect("a weighed candidate estimates again");
    let rep = report::training(r.runtime.name(), Some(model), 0, s, &est);
    (rep.per_device, rep.host)
}

fn setup_json(w: &Weighed) -> Value {
    let mut v = serde_json::to_value(&w.setup).unwrap_or_default();
    v["recompute"] = json!(remedy::recompute_name(w.setup.recompute));
    v
}

/// A training search, what it found and why the rest missed: what both renderings read.
pub struct Found<'a> {
    model: &'a ModelShape,
    r: &'a FitRequest,
    result: &'a FitResult,
    misses: Vec<fit::MissGroup>,
    unsupported: Vec<fit::why::UnsupportedGroup>,
}

type Parts<'a> = (
    &'a ModelShape,
    &'a FitRequest,
    &'a FitResult,
    &'a [fit::MissGroup],
    &'a [fit::why::UnsupportedGroup],
);

impl<'a> Found<'a> {
    pub fn of(model: &'a ModelShape, r: &'a FitRequest, result: &'a FitResult) -> Found<'a> {
        let misses = fit::why_not(model, r, result);
        let unsupported = fit::why::unsupported_groups(result);
        Found {
            model,
            r,
            result,
            misses,
            unsupported,
        }
    }

    fn parts(&self) -> Parts<'_> {
        (
            self.model,
            self.r,
            self.result,
            &self.misses,
            &self.unsupported,
        )
    }
}

pub fn to_json(found: &Found<'_>, top: usize) -> Value {
    let (model, r, result, misses, unsupported) = found.parts();
    let best: Vec<Value> = result
        .fitting
        .iter()
        .take(top)
        .enumerate()
        .map(|(i, w)| {
            let (pd, host) = per_device(model, r, &w.setup);
            let t = w.time().expect("fitting candidates have a step time");
            json!({
                "rank": i + 1,
                "setup": setup_json(w),
                "remedies": w.remedies,
                "flags": remedy::flags(&w.setup, &w.remedies),
                "plan_flags": remedy::plan_flags(&w.setup),
                "plan_command": remedy::plan_command(&model.name, r.runtime, &r.hardware, &w.setup),
                "total_bytes": w.memory().map(|m| m.total_bytes),
                "per_device": pd,
                "host": host,
                "headroom_bytes": r.capacity_bytes.saturating_sub(pd.total_bytes),
                "step_time": t,
                "step_s": t.step_s,
                "tokens_per_s": t.tokens_per_s,
                "bottleneck": t.bottleneck,
            })
        })
        .collect();
    let groups: Vec<Value> = misses
        .iter()
        .map(|g| {
            json!({
                "remedies": g.remedies,
                "count": g.count,
                "closest_setup": setup_json(&g.closest),
                "closest_total_bytes": g.closest_total_bytes,
                "capacity_bytes": g.capacity_bytes,
                "at_peak": g.at_peak,
                "largest_category": g.largest.0,
                "largest_bytes": g.largest.1,
            })
        })
        .collect();
    json!({
        "model": model.name,
        "param_count": model.param_count(),
        "runtime": r.runtime.name(),
        "gpus": r.gpus,
        "device_memory_bytes": r.capacity_bytes,
        "headroom": r.headroom,
        "usable_bytes": r.usable_bytes(),
        "global_batch": r.global_batch,
        "seq": r.seq,
        "tokens_per_step": r.global_batch * r.seq,
        "hardware": r.hardware,
        "remedy_order": fit::Remedy::ALL,
        "baseline": r.baseline(),
        "candidates_weighed": result.candidates_weighed,
        "fitting_count": result.fitting.len(),
        "too_big_count": result.too_big.len(),
        "unsupported_count": result.unsupported.len(),
        "best": best,
        "lora_hint": result.lora_hint.as_ref().map(|w| json!({
            "setup": setup_json(w),
            "flags": remedy::plan_flags(&w.setup),
            "total_bytes": w.memory().map(|m| m.total_bytes),
            "step_s": w.time().map(|t| t.step_s),
        })),
        "rejections": { "groups": groups, "unsupported": unsupported },
    })
}

/// Seconds as people read them: `1.23 s`, or `45 ms` below a second.
pub(super) fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

pub fn short_setup(s: &TrainSetup) -> String {
    let attn = if s.attention == Attention::Flash {
        "flash"
    } else {
        "eager"
    };
    let lora = s.lora.as_ref().map_or(String::new(), |l| {
        format!(" lora-{}", fit::dtype_name(l.base))
    });
    format!(
        "zero {} recompute {} mb {}x{} offload {} dp{}/tp{}/pp{} {attn}{lora}",
        s.zero as u8,
        remedy::recompute_name(s.recompute),
        s.micro_batch,
        s.grad_accum,
        remedy::offload_name(s.offload),
        s.dp,
        s.tp,
        s.pp
    )
}

fn best_table(result: &FitResult, r: &FitRequest, top: usize) -> String {
    let mut t = Table::new(&[
        "#",
        "zero",
        "recompute",
        "micro x accum",
        "offload",
        "dp/tp/pp",
        "attn",
        "states",
        "lora",
        "total",
        "headroom",
        "host/node",
        "step",
        "tokens/s",
        "bottleneck",
    ]);
    for (i, w) in result.fitting.iter().take(top).enumerate() {
        let (m, tm) = (
            w.memory().unwrap_or_else(|| unreachable!()),
            w.time().unwrap_or_else(|| unreachable!()),
        );
        let s = &w.setup;
        t.row(vec![
            (i + 1).to_string(),
            (s.zero as u8).to_string(),
            remedy::recompute_name(s.recompute),
            format!("{} x {}", s.micro_batch, s.grad_accum),
            remedy::offload_name(s.offload).into(),
            format!("{}/{}/{}", s.dp, s.tp, s.pp),
            if s.attention == Attention::Flash {
                "flash"
            } else {
                "eager"
            }
            .into(),
            format!("{}/{}", s.precision, s.optimizer),
            s.lora
                .as_ref()
                .map_or("-".into(), |l| fit::dtype_name(l.base).to_string()),
            human_bytes(m.total_bytes),
            human_bytes(r.capacity_bytes.saturating_sub(m.total_bytes)),
            human_bytes(m.host_node_bytes),
            secs(tm.step_s),
            format!("{:.0}", tm.tokens_per_s),
            tm.bottleneck.label().into(),
        ]);
    }
    t.render()
}

pub fn text(found: &Found<'_>, top: usize) -> String {
    let (model, r, result, misses, unsupported) = found.parts();
    let hw = &r.hardware;
    let mut out = format!(
        "{} ({} parameters) on {} x {} with {} each ({}, {:.0}% kept free), runtime {}\n\
         global batch {} x {} tokens; {:.0} TFLOP/s peak x MFU {:.2}\n\
         weighed {} candidates: {} fit, {} too big, {} unsupported by the runtime\n\n",
        model.name,
        term::group_digits(model.param_count()),
        r.gpus,
        hw.gpu.name,
        human_bytes(r.capacity_bytes),
        gigabytes(r.capacity_bytes),
        r.headroom * 100.0,
        r.runtime.name(),
        r.global_batch,
        r.seq,
        hw.peak_flops(r.precision) / 1e12,
        hw.mfu,
        result.candidates_weighed,
        result.fitting.len(),
        result.too_big.len(),
        result.unsupported.len(),
    );
    if let Some(best) = result.best() {
        out.push_str("best setups (total = allocator reserve + CUDA context, GiB = 2^30 bytes):\n");
        out.push_str(&best_table(result, r, top));
        let names: Vec<String> = best
            .remedies
            .iter()
            .map(|x| format!("{}. {}", *x as u8 + 1, x.label()))
            .collect();
        out.push_str(&format!(
            "\nremedies of #1, in the usual order (micro-batch, recompute, ZeRO, offload, flash attention): {}\n",
            if names.is_empty() {
                "none needed".into()
            } else {
                names.join(", ")
            }
        ));
        out.push_str(&format!(
            "plan it: {}\n",
            remedy::plan_command(&model.name, r.runtime, &r.hardware, &best.setup)
        ));
    } else {
        out.push_str(&format!(
            "nothing fits in {}.\n",
            human_bytes(r.capacity_bytes)
        ));
    }
    if let Some(w) = &result.lora_hint {
        let t = w.time().map_or(0.0, |t| t.step_s);
        out.push_str(&format!(
            "LoRA/QLoRA would {} (not proposed unasked: it trains adapters, not the model): {} at {}, \
             {} per step; see --allow-lora\n",
            if result.fitting.is_empty() { "fit" } else { "be at least 10x faster" },
            short_setup(&w.setup),
            human_bytes(w.memory().map_or(0, |m| m.total_bytes)),
            secs(t),
        ));
    }
    out.push_str(&why_section(misses, unsupported, result));
    out
}

fn why_section(
    misses: &[fit::MissGroup],
    unsupported: &[fit::why::UnsupportedGroup],
    result: &FitResult,
) -> String {
    let mut out = String::new();
    if !misses.is_empty() {
        out.push_str(
            "\nwhy the rest don't fit (closest miss per set of remedies, none of which fits):\n",
        );
        for g in misses.iter().take(8) {
            let names: Vec<&str> = g.remedies.iter().map(|x| x.label()).collect();
            let host = g.closest.memory().map_or(0, |m| m.host_node_bytes);
            if g.closest_total_bytes <= g.capacity_bytes {
                out.push_str(&format!(
                    "  {:<40} {:>4} setups, closest fits the device but needs {} of host memory per node > --host-memory: {}\n",
                    if names.is_empty() { "no remedy".into() } else { names.join(" + ") },
                    g.count,
                    human_bytes(host),
                    short_setup(&g.closest.setup),
                ));
                continue;
            }
            out.push_str(&format!(
                "  {:<40} {:>4} setups, closest {} > {} usable (largest: {} {}): {}\n",
                if names.is_empty() {
                    "no remedy".into()
                } else {
                    names.join(" + ")
                },
                g.count,
                human_bytes(g.closest_total_bytes),
                human_bytes(g.capacity_bytes),
                g.largest.0.trim_end_matches("_bytes"),
                human_bytes(g.largest.1),
                short_setup(&g.closest.setup),
            ));
        }
        if misses.len() > 8 {
            out.push_str(&format!(
                "  ... and {} more sets (see --json)\n",
                misses.len() - 8
            ));
        }
    }
    let explained: usize = misses.iter().map(|g| g.count).sum();
    let rest = result.too_big.len() - explained;
    if rest > 0 {
        out.push_str(&format!(
            "  {rest} more setups don't fit but use remedies that fit in another form (above)\n"
        ));
    }
    for u in unsupported.iter().take(5) {
        out.push_str(&format!(
            "  unsupported by the runtime ({} setups): {}\n",
            u.count, u.reason
        ));
    }
    out
}
