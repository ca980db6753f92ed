//! The engine's integration tests share `train::testkit`; this module only re-exports it.

#![allow(unused_imports)]

pub use train::testkit::*;
