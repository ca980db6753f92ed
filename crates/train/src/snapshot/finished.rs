//! The step of a run's finished model: `train --out DIR` writes `DIR/trainer_state.json`
//! (transformers' Trainer file name, with its `global_step` key) beside the model it saves, so a
//! reader of `DIR` can tell that model from an older snapshot in the same folder — `--save-every
//! 2` over 5 steps leaves snapshots of steps 2 and 4 and a finished model of step 5.
//!
//! Example: `finished::record(dir, 5)?`, then `finished::step(dir) == Some(5)`.

use engine::error::EngineError;
use std::path::Path;

/// The file beside the finished model that records its step.
pub const STEP_FILE: &str = "trainer_state.json";

/// Records that `dir`'s finished model is from `step`.
pub fn record(dir: &Path, step: u64) -> Result<(), EngineError> {
    let text = serde_json::json!({ "global_step": step }).to_string();
    engine::io::write_file(&dir.join(STEP_FILE), text.as_bytes())
}

/// The step `dir`'s finished model is from, when the folder records one (a snapshot folder, or
/// a folder saved before the record existed, has none).
pub fn step(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(STEP_FILE)).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value.get("global_step")?.as_u64()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_recorded_step_reads_back() {
        let dir = std::env::temp_dir().join(format!("frugal-finished-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(super::step(&dir), None);
        super::record(&dir, 5).unwrap();
        assert_eq!(super::step(&dir), Some(5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
