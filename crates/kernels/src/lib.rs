//! The `kernels` crate.
