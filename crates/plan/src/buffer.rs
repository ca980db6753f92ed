//! Buffers and the step timeline: the one source of truth for bytes.
//!
//! A step is an ordered list of phases: persistent state, then the forward pass layer by layer,
//! the head and loss, the backward pass from the last layer to the first, and the optimizer step
//! (inference uses prefill and decode). A buffer lives from the phase it is born in to the phase it
//! dies in, both included; persistent buffers live throughout. The engine enters a phase by
//! allocating every buffer born in it and leaves it by freeing every buffer that dies in it, so its
//! measured peak equals [`MemoryPlan::peak_bytes`] exactly.

use serde::Serialize;

/// What a buffer holds; the categories of the JSON contract (`params_bytes`, `grads_bytes`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Params,
    Grads,
    Optimizer,
    Activations,
    KvCache,
    /// Communication buckets, gathered ZeRO-3 units, workspaces, allocator slack.
    Other,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Params,
        Category::Grads,
        Category::Optimizer,
        Category::Activations,
        Category::KvCache,
        Category::Other,
    ];

    /// The JSON field name of this category's byte count, e.g. `"params_bytes"`.
    pub fn json_field(self) -> &'static str {
        match self {
            Category::Params => "params_bytes",
            Category::Grads => "grads_bytes",
            Category::Optimizer => "optimizer_bytes",
            Category::Activations => "activations_bytes",
            Category::KvCache => "kv_cache_bytes",
            Category::Other => "other_bytes",
        }
    }

    /// The category as a person reads it, e.g. `"kv cache"`.
    pub fn label(self) -> &'static str {
        match self {
            Category::Params => "params",
            Category::Grads => "grads",
            Category::Optimizer => "optimizer",
            Category::Activations => "activations",
            Category::KvCache => "kv cache",
            Category::Other => "other",
        }
    }
}

/// Where a buffer lives: the accelerator (or the CPU arena that stands for it), or host memory
/// (offload).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Gpu,
    Host,
}

/// A point of the step's timeline. Layers are numbered from 0 (nearest the embedding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Token (and position) embedding, forward.
    Embed,
    /// Transformer block `layer`, forward.
    Forward(u32),
    /// Final norm, output projection and loss, forward and backward together.
    Head,
    /// Transformer block `layer`, backward (recompute included).
    Backward(u32),
    /// Embedding backward.
    EmbedBackward,
    /// Gradient reduction tail and the optimizer step.
    Optimizer,
    /// Inference: the prompt's whole forward pass (its scratch shared by every layer), filling
    /// the KV cache.
    Prefill,
    /// Inference: one decode step's forward pass over every layer, reading and extending the
    /// KV cache.
    Decode,
}

/// Which kind of step a plan's phases describe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Timeline {
    /// Embed, Forward(0..L), Head, Backward(L-1..0), EmbedBackward, Optimizer (a forward-only
    /// pass uses its first phases).
    #[default]
    Training,
    /// Prefill, then Decode: a serving step.
    Inference,
}

impl Phase {
    /// Position of this phase on its timeline for a model of `n_layers` blocks.
    pub fn ordinal(self, n_layers: u32) -> u32 {
        match self {
            Phase::Embed | Phase::Prefill => 0,
            Phase::Forward(l) => 1 + l,
            Phase::Decode => 1,
            Phase::Head => 1 + n_layers,
            Phase::Backward(l) => 2 + n_layers + (n_layers - 1 - l),
            Phase::EmbedBackward => 2 + 2 * n_layers,
            Phase::Optimizer => 3 + 2 * n_layers,
        }
    }

    /// Every phase of a training step, in order.
    pub fn training_timeline(n_layers: u32) -> Vec<Phase> {
        let mut phases = vec![Phase::Embed];
        phases.extend((0..n_layers).map(Phase::Forward));
        phases.push(Phase::Head);
        phases.extend((0..n_layers).rev().map(Phase::Backward));
        phases.push(Phase::EmbedBackward);
        phases.push(Phase::Optimizer);
        phases
    }

    /// The phases of `timeline`, in order.
    pub fn timeline(timeline: Timeline, n_layers: u32) -> Vec<Phase> {
        match timeline {
            Timeline::Training => Phase::training_timeline(n_layers),
            Timeline::Inference => vec![Phase::Prefill, Phase::Decode],
        }
    }
}

/// When a buffer is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifetime {
    /// Allocated before the first step and kept across steps (weights, optimizer state).
    Persistent,
    /// Born at the start of `born`, freed at the end of `dies` (both included).
    Span { born: Phase, dies: Phase },
}

/// One named allocation of the plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Buffer {
    /// Stable name, e.g. `"act.h.3.qkv"`, for reports and timelines.
    pub name: String,
    pub category: Category,
    pub device: Device,
    pub bytes: u64,
    pub lifetime: Lifetime,
    /// The `frugal` runtime's typed key (its name is the key's `Display`): the engine's arena
    /// is indexed by it. `None` in the other runtimes' plans.
    #[serde(skip)]
    pub key: Option<crate::key::Key>,
}

impl Buffer {
    /// A buffer of a runtime profile that only reports (no engine allocates it).
    pub fn named(
        name: impl Into<String>,
        category: Category,
        device: Device,
        bytes: u64,
        lifetime: Lifetime,
    ) -> Buffer {
        Buffer {
            name: name.into(),
            category,
            device,
            bytes,
            lifetime,
            key: None,
        }
    }

    /// A buffer the engine allocates, found by `key`.
    pub fn keyed(
        key: crate::key::Key,
        category: Category,
        device: Device,
        bytes: u64,
        lifetime: Lifetime,
    ) -> Buffer {
        Buffer {
            key: Some(key),
            ..Buffer::named(key.to_string(), category, device, bytes, lifetime)
        }
    }
}

/// A step's buffers over a timeline of phases.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryPlan {
    pub buffers: Vec<Buffer>,
    /// Number of transformer blocks, which fixes the phase ordinals.
    pub n_layers: u32,
    /// Which phases the buffers' lifetimes name.
    pub timeline: Timeline,
}

impl MemoryPlan {
    pub fn new(n_layers: u32) -> MemoryPlan {
        MemoryPlan {
            buffers: Vec::new(),
            n_layers,
            timeline: Timeline::Training,
        }
    }

    /// An empty plan over the inference timeline (prefill, decode).
    pub fn inference(n_layers: u32) -> MemoryPlan {
        MemoryPlan {
            timeline: Timeline::Inference,
            ..MemoryPlan::new(n_layers)
        }
    }

    pub fn push(&mut self, buffer: Buffer) {
        self.buffers.push(buffer);
    }

    /// Live bytes per category on `device` at each phase of the plan's timeline.
    ///
    /// A sweep over birth and death ordinals: O(buffers + phases), so the advisor can plan
    /// thousands of setups a second.
    pub fn timeline(&self, device: Device) -> Vec<(Phase, [u64; 6])> {
        let phases = Phase::timeline(self.timeline, self.n_layers);
        let mut delta = vec![[0i128; 6]; phases.len() + 1];
        for b in self.buffers.iter().filter(|b| b.device == device) {
            let (born, dies) = match b.lifetime {
                Lifetime::Persistent => (0, phases.len() - 1),
                Lifetime::Span { born, dies } => (
                    born.ordinal(self.n_layers) as usize,
                    dies.ordinal(self.n_layers) as usize,
                ),
            };
            assert!(born <= dies, "buffer {} dies before it is born", b.name);
            delta[born][b.category as usize] += b.bytes as i128;
            delta[dies + 1][b.category as usize] -= b.bytes as i128;
        }
        let mut live = [0i128; 6];
        phases
            .into_iter()
            .enumerate()
            .map(|(i, phase)| {
                for (l, d) in live.iter_mut().zip(delta[i]) {
                    *l += d;
                }
                (phase, live.map(|v| v as u64))
            })
            .collect()
    }

    /// The phase of the peak on `device` and the live bytes per category then (they sum to
    /// [`MemoryPlan::peak_bytes`]); the first such phase if several tie.
    pub fn at_peak(&self, device: Device) -> (Phase, [u64; 6]) {
        let mut best = (Phase::Embed, [0u64; 6]);
        let mut best_sum = 0;
        for (phase, c) in self.timeline(device) {
            let sum: u64 = c.iter().sum();
            if sum > best_sum {
                best = (phase, c);
                best_sum = sum;
            }
        }
        best
    }

    /// The largest sum of live bytes on `device` over the step.
    pub fn peak_bytes(&self, device: Device) -> u64 {
        self.timeline(device)
            .iter()
            .map(|(_, c)| c.iter().sum::<u64>())
            .max()
            .unwrap_or(0)
    }

    /// Bytes of `category` held all step long (on any device): weights, gradient
    /// accumulators, optimizer state.
    pub fn persistent_bytes(&self, category: Category) -> u64 {
        let held = self
            .buffers
            .iter()
            .filter(|b| b.lifetime == Lifetime::Persistent);
        held.filter(|b| b.category == category)
            .map(|b| b.bytes)
            .sum()
    }

    /// Persistent (parameters, gradients, optimizer state) bytes.
    pub fn persistent_state(&self) -> (u64, u64, u64) {
        let [p, g, o] = [Category::Params, Category::Grads, Category::Optimizer]
            .map(|c| self.persistent_bytes(c));
        (p, g, o)
    }

    /// Model state held all step long: parameters, gradients and optimizer state (ZeRO's
    /// 16Ψ/N for fp32 or mixed-precision AdamW).
    pub fn model_state_bytes(&self) -> u64 {
        let (p, g, o) = self.persistent_state();
        p + g + o
    }

    /// The largest live bytes of each category on `device` over the step (each at its own peak).
    pub fn category_peaks(&self, device: Device) -> [u64; 6] {
        let mut peaks = [0u64; 6];
        for (_, c) in self.timeline(device) {
            for (p, v) in peaks.iter_mut().zip(c) {
                *p = (*p).max(v);
            }
        }
        peaks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(name: &str, category: Category, bytes: u64, lifetime: Lifetime) -> Buffer {
        Buffer::named(name, category, Device::Gpu, bytes, lifetime)
    }

    #[test]
    fn ordinals_follow_their_timelines() {
        for timeline in [Timeline::Training, Timeline::Inference] {
            for (i, p) in Phase::timeline(timeline, 3).iter().enumerate() {
                assert_eq!(p.ordinal(3), i as u32, "{p:?}");
            }
        }
    }

    #[test]
    fn an_inference_plan_peaks_at_the_larger_pass() {
        let mut plan = MemoryPlan::inference(2);
        plan.push(buf("weights", Category::Params, 100, Lifetime::Persistent));
        plan.push(buf("kv", Category::KvCache, 40, Lifetime::Persistent));
        let span = |p| Lifetime::Span { born: p, dies: p };
        plan.push(buf(
            "prefill",
            Category::Activations,
            30,
            span(Phase::Prefill),
        ));
        plan.push(buf("decode", Category::Activations, 5, span(Phase::Decode)));
        assert_eq!(plan.peak_bytes(Device::Gpu), 170);
        let (phase, at) = plan.at_peak(Device::Gpu);
        assert_eq!(
            (phase, at[Category::KvCache as usize]),
            (Phase::Prefill, 40)
        );
        assert_eq!(
            plan.timeline(Device::Gpu)[1].1[Category::Activations as usize],
            5
        );
    }

    #[test]
    fn peak_is_the_largest_sum_of_live_bytes() {
        let mut plan = MemoryPlan::new(2);
        plan.push(buf("w", Category::Params, 100, Lifetime::Persistent));
        let span = |born, dies| Lifetime::Span { born, dies };
        plan.push(buf(
            "a0",
            Category::Activations,
            10,
            span(Phase::Forward(0), Phase::Backward(0)),
        ));
        plan.push(buf(
            "a1",
            Category::Activations,
            20,
            span(Phase::Forward(1), Phase::Backward(1)),
        ));
        plan.push(buf(
            "g",
            Category::Grads,
            5,
            span(Phase::Backward(1), Phase::Optimizer),
        ));
        // At Backward(1): w + a0 + a1 + g = 135.
        assert_eq!(plan.peak_bytes(Device::Gpu), 135);
        assert_eq!(plan.peak_bytes(Device::Host), 0);
        let peaks = plan.category_peaks(Device::Gpu);
        assert_eq!(peaks[Category::Activations as usize], 30);
    }
}
