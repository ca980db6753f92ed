//! The engine's integration tests share `engine::testkit`; this module only re-exports it.

#![allow(unused_imports)]

pub use engine::testkit::*;
