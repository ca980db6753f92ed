//! Why the rest don't fit: the candidates that miss, grouped by the remedies they apply, each
//! group with its closest miss (total against capacity, and the largest category at the peak),
//! and the candidates a runtime does not model, grouped by its reason.
//!
//! Only groups with no fitting member are listed: a group with one that fits is explained by
//! the ranking. Not here: the ranking itself. Example: `why_not(&model, &request, &result)`.

use super::{FitRequest, FitResult, Remedy, Weighed};
use crate::report::{self, Breakdown};
use plan::{ModelShape, TrainSetup};
use serde::Serialize;
use std::collections::BTreeMap;

/// Candidates that apply exactly `remedies` and none of which fits.
#[derive(Clone, Debug, Serialize)]
pub struct MissGroup {
    pub remedies: Vec<Remedy>,
    pub count: usize,
    /// The member closest to fitting.
    pub closest: Weighed,
    pub closest_total_bytes: u64,
    pub capacity_bytes: u64,
    /// Categories live at the closest member's peak (its fields: docs/cli.md).
    pub at_peak: Breakdown,
    /// The largest of them: `("optimizer_bytes", n)`.
    pub largest: (&'static str, u64),
}

/// Candidates the runtime refused for the same reason.
#[derive(Clone, Debug, Serialize)]
pub struct UnsupportedGroup {
    pub reason: String,
    pub count: usize,
    pub example: TrainSetup,
}

/// The largest category of a breakdown, by its JSON name.
pub fn largest_category(b: &Breakdown) -> (&'static str, u64) {
    let all = [
        ("params_bytes", b.params_bytes),
        ("grads_bytes", b.grads_bytes),
        ("optimizer_bytes", b.optimizer_bytes),
        ("activations_bytes", b.activations_bytes),
        ("kv_cache_bytes", b.kv_cache_bytes),
        ("other_bytes", b.other_bytes),
    ];
    all.into_iter()
        .fold(all[0], |a, x| if x.1 > a.1 { x } else { a })
}

/// The categories at the peak of `setup` under the request's runtime.
pub fn breakdown(model: &ModelShape, r: &FitRequest, setup: &TrainSetup) -> Breakdown {
    match r.runtime.estimate(model, setup) {
        Ok(e) => {
            report::training(r.runtime.name(), Some(model), 0, setup, &e)
                .per_device
                .categories
        }
        Err(_) => Breakdown::default(),
    }
}

/// Remedy sets none of whose candidates fit, in the usual order (fewest remedies first), each
/// with its closest miss.
pub fn why_not(model: &ModelShape, r: &FitRequest, result: &FitResult) -> Vec<MissGroup> {
    let fitting_sets: std::collections::BTreeSet<&Vec<Remedy>> =
        result.fitting.iter().map(|w| &w.remedies).collect();
    let mut groups: BTreeMap<(usize, Vec<Remedy>), (usize, &Weighed, u64)> = BTreeMap::new();
    for w in &result.too_big {
        if fitting_sets.contains(&w.remedies) {
            continue;
        }
        let total = w.memory().map_or(u64::MAX, |m| m.total_bytes);
        let entry = groups
            .entry((w.remedies.len(), w.remedies.clone()))
            .or_insert((0, w, total));
        entry.0 += 1;
        if total < entry.2 {
            (entry.1, entry.2) = (w, total);
        }
    }
    groups
        .into_iter()
        .map(|((_, remedies), (count, w, total))| {
            let at_peak = breakdown(model, r, &w.setup);
            MissGroup {
                remedies,
                count,
                closest: w.clone(),
                closest_total_bytes: total,
                capacity_bytes: r.usable_bytes(),
                largest: largest_category(&at_peak),
                at_peak,
            }
        })
        .collect()
}

/// The runtime's refusals, most frequent first.
pub fn unsupported_groups(result: &FitResult) -> Vec<UnsupportedGroup> {
    let mut by_reason: BTreeMap<&str, (usize, &TrainSetup)> = BTreeMap::new();
    for w in &result.unsupported {
        if let super::Outcome::Unsupported { reason } = &w.outcome {
            by_reason.entry(reason).or_insert((0, &w.setup)).0 += 1;
        }
    }
    let mut out: Vec<UnsupportedGroup> = by_reason
        .into_iter()
        .map(|(reason, (count, s))| UnsupportedGroup {
            reason: reason.to_string(),
            count,
            example: s.clone(),
        })
        .collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.count));
    out
}
