//! `train.json`: everything about a run a snapshot needs besides tensors — the step counter and
//! the schedule's position, the data loader's position, the seed (the only source of randomness:
//! weight init and the data order are pure functions of it), the fp16 loss scaler's settings and
//! state, the model's shape, the training setup and the world it ran on.
//!
//! Fields split in two: the run's *identity* (model, optimizer, schedule, clipping, sequence
//! length, global batch, accumulation, seed, weight precision and loss scaler) must match for a resumed run to continue the same
//! trajectory, and a mismatch is refused with every difference listed; the *world* (ranks, ZeRO
//! stage, per-rank rows, recompute, attention kernel) may change, since the optimizer state is
//! resharded on load.
//!
//! Example: `TrainState::of(&trainer, &run).differences(&TrainState::of(&other, &run))` is empty
//! when `other` may resume from a snapshot of `trainer`.

use super::error::Difference;
use super::files::FORMAT_VERSION;
use crate::precision::{LossScaler, ScalerConfig, ScalerState};
use crate::{Mixed, TrainConfig, Trainer};
use serde::{Deserialize, Serialize};

/// The dynamic loss scaler (fp16 training): its settings and everything that moves per step.
/// `None` in fp32 and bf16 runs, which have no scaler.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScalerState {
    pub config: ScalerConfig,
    pub state: ScalerState,
}

impl LossScalerState {
    pub fn of(scaler: &LossScaler) -> LossScalerState {
        LossScalerState {
            config: *scaler.config(),
            state: *scaler.state(),
        }
    }
}

/// What the training loop (not the trainer) knows and a snapshot must keep. (The loss scaler is
/// the trainer's: `save` takes it from there and `restore` puts it back.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunState {
    /// The batch the loader produces next.
    pub loader: data::LoaderPosition,
    /// Seed of the weights and the data order.
    pub seed: u64,
    /// The training data's identity (`data::tokens_id` of its token stream), when known.
    pub data: Option<u64>,
}

/// What must match for a resumed run to continue the same trajectory (besides the model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunFields {
    pub optimizer: String,
    pub lr: f32,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub min_lr_ratio: f32,
    pub grad_clip: Option<f32>,
    pub seq: u64,
    /// Rows of one global micro-batch: data-parallel ranks × rows per rank.
    pub global_rows: u64,
    pub grad_accum: u32,
    pub seed: u64,
    /// `fp32`, `bf16` or `fp16`: the master weights and Adam state mean the same only within one
    /// (snapshots from before 2-byte snapshots are fp32).
    #[serde(default = "fp32_name")]
    pub precision: String,
    /// fp16: the loss scaler's kind and settings (`null` otherwise).
    #[serde(default)]
    pub loss_scaler: serde_json::Value,
    /// The training data's identity: a hash of its token stream (absent in older snapshots).
    #[serde(default)]
    pub data: Option<u64>,
    /// LoRA: rank, α, targets and the base's format (`null` for full training). The snapshot's
    /// weights are the adapters; the resumed run reads the base from its `--model` again.
    #[serde(default)]
    pub lora: serde_json::Value,
}

fn one() -> u32 {
    1
}

fn fp32_name() -> String {
    "fp32".into()
}

/// The world the snapshot was taken on; a resumed run may use another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorldFields {
    pub ranks: u32,
    /// Tensor-parallel ranks and pipeline stages (1 in older snapshots).
    #[serde(default = "one")]
    pub tp: u32,
    #[serde(default = "one")]
    pub pp: u32,
    /// Shard files: one per rank, or one of the whole model from a tensor- or pipeline-parallel
    /// run (absent: `ranks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_files: Option<u32>,
    pub zero: serde_json::Value,
    pub rows_per_rank: u64,
    pub precision: serde_json::Value,
    pub recompute: serde_json::Value,
    pub attention: serde_json::Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderFields {
    pub epoch: u64,
    pub batch_in_epoch: u64,
}

/// The contents of `train.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub format_version: u32,
    /// Optimizer steps taken; the resumed run's next step has this 0-based index.
    pub step: u64,
    /// The learning rate of the next step (the schedule's position, for reading).
    pub next_lr: f32,
    pub loader: LoaderFields,
    pub loss_scaler: Option<LossScalerState>,
    /// The model's whole config (`ModelConfig::identity`): every shape field, the numerics and
    /// the routing.
    pub model: serde_json::Value,
    pub run: RunFields,
    pub world: WorldFields,
}

fn json<T: Serialize>(value: T) -> serde_json::Value {
    serde_json::to_value(value).expect("plan enums serialise")
}

/// `value` as JSON read back from its text, so f32 fields show as written (0.002), not widened
/// to f64 (0.0020000000949949026).
fn text<T: Serialize>(value: &T) -> serde_json::Value {
    let text = serde_json::to_string(value).expect("train state serialises");
    serde_json::from_str(&text).expect("JSON text parses")
}

impl TrainState {
    pub fn of<B: engine::backend::TrainOps>(trainer: &Trainer<B>, run: &RunState) -> TrainState {
        let mut state = TrainState::of_config(&trainer.config, trainer.step, run);
        state.loss_scaler = trainer.scaler.as_ref().map(LossScalerState::of);
        state
    }

    /// The state of a run of `c` after `step` steps (without a scaler state: that is the
    /// trainer's, see [`TrainState::of`]).
    pub fn of_config(c: &TrainConfig, step: u64, run: &RunState) -> TrainState {
        let setup = c.setup();
        TrainState {
            format_version: FORMAT_VERSION,
            step,
            next_lr: c.schedule.lr_at(step),
            loader: LoaderFields {
                epoch: run.loader.epoch,
                batch_in_epoch: run.loader.batch_in_epoch,
            },
            loss_scaler: None,
            model: c.model.identity(),
            run: RunFields::of(c, &c.mixed, run.seed, run.data),
            world: WorldFields {
                ranks: c.ranks,
                tp: c.tp.max(1),
                pp: c.pp.max(1),
                shard_files: (c.tp > 1 || c.pp > 1).then_some(1),
                zero: json(setup.zero),
                rows_per_rank: c.batch,
                precision: json(setup.precision),
                recompute: json(setup.recompute),
                attention: json(setup.attention),
            },
        }
    }

    pub fn loader_position(&self) -> data::LoaderPosition {
        data::LoaderPosition {
            epoch: self.loader.epoch,
            batch_in_epoch: self.loader.batch_in_epoch,
        }
    }

    /// Every identity field (`model.*`, `run.*`) whose value differs, snapshot (`self`) first.
    /// The model and the LoRA settings are compared leaf by leaf (`model.sliding_window.window`);
    /// a field the snapshot does not record (it predates the field) is not compared.
    pub fn differences(&self, this_run: &TrainState) -> Vec<Difference> {
        let root =
            |s: &TrainState| serde_json::json!({ "model": text(&s.model), "run": text(&s.run) });
        let (ours, theirs) = (root(self), root(this_run));
        let mut fields = Vec::new();
        leaves("model", &ours["model"], &mut fields);
        for (k, v) in ours["run"].as_object().into_iter().flatten() {
            let path = format!("run.{k}");
            match k.as_str() {
                // A LoRA run against a full one differs as a whole (`--lora-rank`), not per field.
                "lora" if !v.is_null() && !theirs["run"]["lora"].is_null() => {
                    leaves(&path, v, &mut fields)
                }
                _ => fields.push((path, v.clone())),
            }
        }
        fields
            .into_iter()
            // The preset's name is a label, not a shape: a config.json of the same shape may resume.
            .filter(|(field, _)| field != "model.name")
            .filter_map(|(field, a)| {
                let b = field.split('.').try_fold(&theirs, |v, k| v.get(k));
                (b != Some(&a)).then(|| Difference {
                    snapshot: a.to_string(),
                    this_run: b.map_or_else(|| "absent".into(), |b| b.to_string()),
                    field,
                })
            })
            .collect()
    }
}

impl RunFields {
    fn of(c: &TrainConfig, mixed: &Mixed, seed: u64, data: Option<u64>) -> RunFields {
        RunFields {
            optimizer: format!("{:?}", c.optimizer),
            lr: c.schedule.lr,
            warmup_steps: c.schedule.warmup_steps,
            total_steps: c.schedule.total_steps,
            min_lr_ratio: c.schedule.min_lr_ratio,
            grad_clip: c.grad_clip,
            seq: c.seq,
            global_rows: c.batch * u64::from(c.dp()),
            grad_accum: c.grad_accum,
            seed,
            precision: format!("{:?}", mixed.precision).to_lowercase(),
            loss_scaler: match mixed.precision {
                plan::setup::Precision::Fp16 => json(mixed.loss_scaler.unwrap_or(default_scaler())),
                _ => serde_json::Value::Null,
            },
            data,
            lora: match &c.lora {
                Some(l) => serde_json::json!({
                    "rank": l.plan.rank,
                    "alpha": l.alpha,
                    "targets": l.plan.targets.join(","),
                    "base": format!("{:?}", l.plan.base).to_lowercase(),
                    "double_quant": l.plan.double_quant,
                    "dropout": l.plan.dropout,
                    "base_weights": l.base_weights.map(|f| format!("{f:016x}")),
                }),
                None => serde_json::Value::Null,
            },
        }
    }
}

/// The scaler an fp16 trainer gets when `Mixed` names none (`Trainer::mixed`'s default).
fn default_scaler() -> ScalerConfig {
    *LossScaler::torch().config()
}

/// `prefix.a.b` = value for each leaf of a JSON value (objects' keys sorted, the same for both
/// sides; an empty object or a null is a leaf).
fn leaves(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(&format!("{prefix}.{k}"), v, out);
            }
        }
        other => out.push((prefix.into(), other.clone())),
    }
}
