//! Operating errors of snapshots: each names the file or field at fault and what to do about it.
//!
//! Example: a bit-flipped shard gives `ChecksumMismatch { path: ".../optim-rank-00001-of-00002
//! .safetensors", .. }`, whose message says the snapshot is damaged and to resume from another.

use engine::error::EngineError;
use std::path::PathBuf;
use thiserror::Error;

/// One field that differs between a snapshot and the run that wants to resume from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub field: String,
    pub snapshot: String,
    pub this_run: String,
}

impl Difference {
    /// What sets this field on the command line.
    pub fn set_by(&self) -> &'static str {
        let f = self.field.as_str();
        match f {
            "run.optimizer" => "--optimizer",
            "run.lr" => "--lr",
            "run.warmup_steps" => "--warmup (20 by default, or --steps when fewer)",
            "run.total_steps" => "--steps (a resumed run keeps the schedule it started with)",
            "run.min_lr_ratio" => "the schedule",
            "run.grad_clip" => "--grad-clip",
            "run.seq" => "--seq",
            "run.global_rows" => "--batch (per rank) times the data-parallel ranks",
            "run.grad_accum" => "--grad-accum",
            "run.seed" => "--seed",
            "run.precision" => "--precision",
            "run.loss_scaler" => "--loss-scaler",
            "run.data" => "--data",
            "run.lora.rank" => "--lora-rank",
            "run.lora.alpha" => "--lora-alpha",
            "run.lora.targets" => "--lora-targets",
            "run.lora.base" | "run.lora.double_quant" => "--lora-base, --double-quant",
            "run.lora.dropout" => "--lora-dropout",
            "run.lora.base_weights" => "--model (the base the adapters were trained over)",
            "run.lora" => "--lora-rank",
            _ if f.starts_with("model.") => "--model (the run's model or its config.json)",
            _ => "the run's flags",
        }
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: snapshot {} vs this run {} (set by {})",
            self.field,
            self.snapshot,
            self.this_run,
            self.set_by()
        )
    }
}

fn list(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(|d| format!("\n  {d}"))
        .collect::<String>()
}

#[derive(Debug, Error)]
pub enum SnapshotError {
    /// (The OS error is in the message, not a `source`, so a chain prints it once.)
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
    /// `--resume` named a path that does not exist.
    #[error("{path} does not exist; pass a snapshot folder or the --out folder of a run")]
    Missing { path: PathBuf },
    /// `--resume` named a folder holding no committed snapshot.
    #[error(
        "{path} holds no committed snapshot (a snapshot is a step-NNNNNN folder with a \
         manifest.json); pass a snapshot folder or the --out folder of a run that saved one"
    )]
    NotFound { path: PathBuf },
    #[error("{path}: {reason}; the snapshot is damaged, resume from an older one")]
    BadManifest { path: PathBuf, reason: String },
    #[error(
        "{path} has snapshot format version {found}, this frugal reads version {supported}; \
         use the frugal that wrote it"
    )]
    UnknownVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// A file is shorter or longer than the manifest says (truncated by a crash or a copy).
    #[error(
        "{path} is {found_bytes} bytes but the manifest says {expected_bytes}: the file is \
         truncated or damaged; resume from an older snapshot"
    )]
    SizeMismatch {
        path: PathBuf,
        expected_bytes: u64,
        found_bytes: u64,
    },
    #[error(
        "{path} fails its checksum (crc32 {found:08x}, manifest {expected:08x}): the file is \
         damaged; resume from an older snapshot"
    )]
    ChecksumMismatch {
        path: PathBuf,
        expected: u32,
        found: u32,
    },
    /// A file is whole but its contents do not match what the manifest and state describe.
    #[error("{path}: {reason}")]
    BadContents { path: PathBuf, reason: String },
    /// The snapshot was taken from another model or training setup.
    #[error(
        "the snapshot in {path} was taken from a different run; these differ (change this \
         run's flags to the snapshot's values, or start a new run without --resume):{}",
        list(differences)
    )]
    Mismatch {
        path: PathBuf,
        differences: Vec<Difference>,
    },
    /// The engine refused something while saving or restoring (a collective failed, weights).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl SnapshotError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
        let context = context.into();
        move |cause| SnapshotError::Io { context, cause }
    }
}
