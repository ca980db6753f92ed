//! The typed keys of a `frugal` plan's buffers (`plan::key`), re-exported where the plan's
//! modules name them.

pub use plan::key::*;
