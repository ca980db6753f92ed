//! PEFT files.
