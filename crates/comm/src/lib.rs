//! Collective communication for data-parallel training: the `Collective` trait (all-reduce,
//! reduce-scatter, all-gather, broadcast, barrier over f32 and bf16 buffers) and its backends.
//! Today: `InProcess`, N ranks as threads sharing memory, `Mpi` (the `mpi` feature), and `Solo`,
//! the world of one; `Counted` wraps any of them and counts the bytes it moves and the time its
//! caller spends blocked; `Overlapped` moves any of them onto a thread of its own, so an
//! all-gather started with `start_all_gather` runs while the caller computes. Knows nothing
//! about models.
//!
//! # Contract every backend keeps
//! - **Deterministic reduction order.** Element i of a reduction is
//!   `((x0 ⊕ x1) ⊕ …) ⊕ x(N−1)` in rank order, accumulated in f32 (bf16 widened exactly),
//!   `Avg` divides by N in f32, and bf16 is rounded once at the end (`reference` is the
//!   definition). The result is bit-identical on every rank and whatever the thread timing.
//! - **Never a hang.** Every collective has a timeout. A rank that panics (its handle is
//!   dropped while unwinding), returns early, stalls, calls `abort`, passes bad arguments or
//!   makes a different call than the others fails the world: every other rank's pending and
//!   later calls return a `CommError` naming that rank.
//! - **Bytes are counted as a ring moves them**, by `Counted` for every backend (`CommStats`):
//!   per rank, all-reduce 2(N−1)/N·size, reduce-scatter and all-gather (N−1)/N·size of the full
//!   buffer, so a step's count compares directly with the ZeRO paper's 2Ψ (stages 0-2) and 3Ψ
//!   (stage 3).
//!
//! # How MPI and NCCL backends fit without engine changes
//! The trait is object-safe and speaks only plain slices (`Buf`/`BufMut` of f32 or bf16), a
//! `ReduceOp` and a root rank: no closures, no shared-memory handles, no backend types. Each
//! method is one library call: `all_reduce` → `MPI_Allreduce` / `ncclAllReduce`,
//! `reduce_scatter` → `MPI_Reduce_scatter_block` / `ncclReduceScatter`, `all_gather` →
//! `MPI_Allgather` / `ncclAllGather`, `broadcast` → `MPI_Bcast` / `ncclBroadcast`; `DType`
//! maps to `MPI_FLOAT`/a bf16 datatype and `ncclFloat32`/`ncclBfloat16`; `Avg` is
//! `ncclAvg` (or a sum then a local divide under MPI). What those libraries do not promise
//! is the rank-order summation: an MPI/NCCL backend must either use an algorithm with a fixed
//! order (e.g. NCCL ring with a fixed channel count, `NCCL_ALGO=Ring`) or document a tolerance;
//! the engine's parity tests then switch from bit-exact to that tolerance. Timeouts map to
//! MPI's error handlers / `ncclCommAbort` from a watchdog thread; `abort` is `MPI_Abort` /
//! `ncclCommAbort`. Device buffers (NCCL) would need a `Buf` variant for device pointers;
//! that is an addition, not a change, to this API.
//!
//! ```
//! use comm::{Collective, InProcess, ReduceOp};
//! let ranks = InProcess::world(3).unwrap();
//! let got: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let joins: Vec<_> = ranks
//!         .into_iter()
//!         .map(|mut c| {
//!             s.spawn(move || {
//!                 let r = c.rank() as f32;
//!                 let input = [r, 10.0 * r, 100.0 * r]; // world × shard, shard = 1
//!                 let mut mine = [0.0f32];
//!                 c.reduce_scatter(input.as_slice().into(), mine.as_mut_slice().into(), ReduceOp::Sum).unwrap();
//!                 let mut all = [0.0f32; 3];
//!                 c.all_gather(mine.as_slice().into(), all.as_mut_slice().into()).unwrap();
//!                 all.to_vec()
//!             })
//!         })
//!         .collect();
//!     joins.into_iter().map(|j| j.join().unwrap()).collect()
//! });
//! assert!(got.iter().all(|v| v == &[3.0, 30.0, 300.0]));
//! ```

mod collective;
mod counted;
mod error;
mod inprocess;
#[cfg(feature = "mpi")]
mod mpi;
mod overlapped;
mod reduce;
mod solo;
mod stats;
mod transport;

pub use collective::{Buf, BufMut, Collective, CollectiveKind, DType, ReduceOp, Ticket};
pub use counted::Counted;
pub use error::{CommError, Result};
pub use inprocess::{InProcess, InProcessComm, InProcessOptions};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
pub use overlapped::Overlapped;
pub use reduce::reference;
pub use solo::Solo;
pub use stats::{CommStats, KindStats};
pub use transport::Transport;
