//! The `engine` crate.
