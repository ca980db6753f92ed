//! The `data` crate.
