//! The `comm` crate.
