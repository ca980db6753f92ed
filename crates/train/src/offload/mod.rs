//! `--offload optimizer[:disk]`: fp32 master weights and Adam moments off the device, and the
//! optimizer step run where they live, on the host's cores.
//!
//! [`OffloadStore`] holds, per parameter unit, `master | m | v` back to back: in host memory, or
//! in a memory-mapped file (`optimizer:disk`, for models whose optimizer state exceeds RAM: the
//! kernel pages units in and out as the step sweeps them). The step is
//! `precision::adamw_master_step` (vectorised, rayon over chunks), so the offloaded update is the
//! device update bit for bit; it reads the unit's gradients (f32, bf16 or f16) and writes the
//! device's working copy. With the plan's host buffers the same step runs on a host `Arena`
//! (`Device::Host`) instead; the store is for the file-backed case and for callers without a plan.
//!
//! The file is created at start-up with its full size written (so a full disk is an error now,
//! not a crash mid-run), refuses to overwrite an existing file, and is removed when the store is
//! dropped: it is scratch space; snapshots hold the state.
//!
//! ```
//! use train::offload::OffloadStore;
//! use train::precision::{Grads, MasterStep};
//! let mut store = OffloadStore::in_memory(&[3, 5]);
//! store.unit(1).master.copy_from_slice(&[1.0; 5]);
//! let step = MasterStep { opt: Default::default(), step: 1, grad_multiplier: 1.0 };
//! store.step_unit(1, Grads::F32(&[0.5; 5]), None, step);
//! assert!(store.unit(1).master[0] < 1.0);
//! // master, m, v: 9 and 15 f32, each unit rounded up to a 64-byte boundary.
//! assert_eq!(store.bytes(), 4 * (16 + 16));
//! ```

mod store;

pub use store::{OffloadStore, UnitState};

pub use engine::error::OffloadError;
