//! The `formats` crate.
