//! Operating errors of the planner: each names the field at fault and how to fix it.

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    /// A value the user gave is out of range or inconsistent with another.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A setup this runtime profile does not model.
    #[error("the {runtime} runtime does not support {what}")]
    Unsupported { runtime: &'static str, what: String },
}
