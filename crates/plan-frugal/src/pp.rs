//! Pipeline parallelism: which layers each of `pp` stages holds, what a stage's plan keeps, and
//! how many micro-batches' activations it stashes under the 1F1B schedule.
//!
//! Layers are split into contiguous stages as evenly as they go: the first `L % pp` stages hold
//! one layer more. The embedding lives on the first stage and the final norm with the classifier
//! on the last; a model whose output projection is tied to the token embedding (GPT-2) keeps a
//! copy of the embedding unit on the last stage too (Megatron's), whose gradient is summed with
//! the first stage's after the micro-batches, so both copies take the same update.
//!
//! A stage plans one micro-batch's step of its own layers (a model of its layers, [`shape`]):
//! the first stage has the token ids, the last the targets and the head; every other stage has
//! neither, and receives its input into `act.encoded` and its output gradient into
//! `dact.residual`. Under 1F1B (PipeDream-Flush, Megatron's default schedule) stage `s` of `p`
//! runs `min(p - s - 1, m)` forwards before its first backward, so up to `min(p - s, m)`
//! micro-batches are in flight: what a forward keeps for its backward (every activation live
//! across the forward/backward boundary, [`kept_across`], and the token ids the embedding's
//! backward reads, [`stashed`]) is copied into one of that many stash slots (`act.stash.<k>`)
//! and copied back before its backward; the last stage runs each
//! micro-batch's backward right after its forward and stashes nothing. Each stage also holds
//! `work.pp_exchange` (2 × its boundary tensor): both halves of one send/receive with a
//! neighbour.
//!
//! Example: 12 layers over 5 stages are 3, 3, 2, 2, 2; stage 0 of 4 at 8 micro-batches keeps 4
//! stash slots, stage 3 none.

use super::key::Key;
use super::units::UnitKind;
use plan::buffer::{Buffer, Category, Lifetime, MemoryPlan};
use plan::{ModelShape, PlanError};

/// One pipeline stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    pub index: u32,
    pub count: u32,
    /// Its first layer in the whole model, and how many it holds.
    pub first_layer: u32,
    pub layers: u32,
}

impl Stage {
    /// The whole model as one stage.
    pub fn whole(n_layers: u32) -> Stage {
        Stage {
            index: 0,
            count: 1,
            first_layer: 0,
            layers: n_layers,
        }
    }

    /// Stage `index` of `count` over `n_layers` layers (the first `n_layers % count` hold one
    /// more).
    pub fn of(n_layers: u32, count: u32, index: u32) -> Stage {
        let (base, extra) = (n_layers / count, n_layers % count);
        Stage {
            index,
            count,
            first_layer: index * base + index.min(extra),
            layers: base + u32::from(index < extra),
        }
    }

    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The unit of the whole model a unit of this stage's model is.
    pub fn whole_kind(&self, kind: UnitKind) -> UnitKind {
        match kind {
            UnitKind::Block(l) => UnitKind::Block(self.first_layer + l),
            other => other,
        }
    }

    /// Whether this stage holds the unit `kind` of its model: its blocks, the embedding (first
    /// stage; the last too when the head is tied to it), the head (last stage).
    pub fn holds(&self, kind: UnitKind, tied: bool) -> bool {
        match kind {
            UnitKind::Block(_) => true,
            UnitKind::Embed => self.is_first() || (self.is_last() && tied),
            UnitKind::Head => self.is_last(),
        }
    }

    /// Micro-batches whose activations it stashes under 1F1B with `micro_batches` of them.
    pub fn stash_slots(&self, micro_batches: u32) -> u32 {
        match self.is_last() {
            true => 0,
            false => (self.count - self.index).min(micro_batches),
        }
    }

    /// Forwards before the first backward under 1F1B.
    pub fn warmup(&self, micro_batches: u32) -> u32 {
        (self.count - self.index - 1).min(micro_batches)
    }
}

/// Refuses a pipeline the model cannot fill: more stages than layers.
pub fn check(model: &ModelShape, pp: u32) -> Result<(), PlanError> {
    if pp == 0 || pp > model.n_layers {
        return Err(PlanError::Invalid {
            field: "--pp".into(),
            reason: format!(
                "--pp {pp} stages over {} layers: every stage needs at least one layer (use \
                 --pp 1 to {})",
                model.n_layers, model.n_layers
            ),
        });
    }
    Ok(())
}

/// The model a stage computes: its layers (the layer-dependent fields shifted to them).
pub fn shape(model: &ModelShape, stage: Stage) -> ModelShape {
    let shift = |l: u32| l.saturating_sub(stage.first_layer);
    let mut local = ModelShape {
        n_layers: stage.layers,
        ..model.clone()
    };
    if let Some(w) = local.sliding_window.as_mut() {
        w.first_layer = shift(w.first_layer);
    }
    if let Some(e) = local.moe.as_mut() {
        e.first_dense = shift(e.first_dense);
    }
    local
}

/// Keys of what a stage without the embedding or the head does not hold.
pub fn not_held(key: Key, stage: Stage) -> bool {
    let head = matches!(
        key,
        Key::Lnf
            | Key::LnfRstd
            | Key::LnfMean
            | Key::Losses
            | Key::DLnf
            | Key::Classifier
            | Key::Targets
            | Key::Work(super::key::Work::TpStats)
    );
    let embedding = matches!(key, Key::Tokens | Key::Work(super::key::Work::EmbedOrder));
    (head && !stage.is_last()) || (embedding && !stage.is_first())
}

/// Indices of the plan's device buffers live across the boundary between a micro-batch's last
/// forward phase and the head: what a stage parks after a forward and revives for its backward.
pub fn kept_across(plan: &MemoryPlan) -> Vec<usize> {
    let n = plan.n_layers;
    let (last_forward, head) = (
        plan::buffer::Phase::Forward(n - 1).ordinal(n),
        plan::buffer::Phase::Head.ordinal(n),
    );
    (plan.buffers.iter().enumerate())
        .filter(|(_, b)| b.device == plan::buffer::Device::Gpu)
        .filter(|(_, b)| match b.lifetime {
            Lifetime::Persistent => false,
            Lifetime::Span { born, dies } => {
                born.ordinal(n) <= last_forward && dies.ordinal(n) >= head
            }
        })
        .map(|(i, _)| i)
        .collect()
}

/// Indices of what a stash slot holds: the saved activations of [`kept_across`] (workspaces
/// are parked, not stashed: nothing in them crosses the boundary) and the token ids, which the
/// embedding's backward reads after later forwards have loaded theirs.
pub fn stashed(plan: &MemoryPlan) -> Vec<usize> {
    let mut out: Vec<usize> = (kept_across(plan).into_iter())
        .filter(|&i| plan.buffers[i].category == Category::Activations)
        .collect();
    out.extend(plan.buffers.iter().position(|b| b.key == Some(Key::Tokens)));
    out
}

/// The stash of `slots` micro-batches: one buffer per slot holding [`stashed`].
pub fn stash_buffers(plan: &MemoryPlan, slots: u32) -> Vec<Buffer> {
    let bytes: u64 = stashed(plan)
        .into_iter()
        .map(|i| plan.buffers[i].bytes)
        .sum();
    (0..slots)
        .map(|k| {
            let key = Key::Stash(k);
            Buffer::keyed(
                key,
                Category::Activations,
                plan::buffer::Device::Gpu,
                bytes,
                Lifetime::Persistent,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_split_layers_evenly_the_first_taking_the_remainder() {
        let split: Vec<(u32, u32)> = (0..5)
            .map(|i| Stage::of(12, 5, i))
            .map(|s| (s.first_layer, s.layers))
            .collect();
        assert_eq!(split, [(0, 3), (3, 3), (6, 2), (8, 2), (10, 2)]);
        let s = Stage::of(4, 4, 0);
        assert_eq!((s.warmup(8), s.stash_slots(8)), (3, 4));
        assert_eq!(Stage::of(4, 4, 3).stash_slots(8), 0);
        assert_eq!(Stage::of(4, 2, 0).stash_slots(1), 1);
    }

    #[test]
    fn more_stages_than_layers_are_refused_naming_both() {
        let model = plan::presets::by_name("gpt2-tiny").unwrap();
        let e = check(&model, 3).unwrap_err().to_string();
        assert!(e.contains("--pp 3") && e.contains("2 layers"), "{e}");
    }
}
