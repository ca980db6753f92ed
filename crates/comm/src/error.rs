//! `CommError`: every way a collective can fail, with the facts needed to find the culprit.
//!
//! Holds only the error type. Which backend raises which variant is documented on the variants;
//! detection logic lives in the backends (e.g. `inprocess::world`).
//!
//! ```
//! use comm::CommError;
//! let e = CommError::RankGone { rank: 2, panicked: true };
//! assert!(e.to_string().contains("rank 2 panicked"));
//! ```

use std::time::Duration;

/// A failed collective. Once any rank sees a world-level failure (everything but `EmptyWorld`),
/// the world is unusable: every later call on every rank returns the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// `world(0)`: a world needs at least one rank.
    #[error("a communication world needs at least 1 rank, got 0; pass a rank count of 1 or more")]
    EmptyWorld,

    /// A rank's communicator was dropped: its thread panicked (`panicked`), or it returned
    /// early and will never join another collective.
    #[error(
        "{}",
        if *panicked {
            format!("rank {rank} panicked, so the world cannot finish its collectives; the cause is rank {rank}'s own error")
        } else {
            format!("rank {rank} dropped its communicator and left the world; every rank must make the same sequence of collective calls")
        }
    )]
    RankGone { rank: usize, panicked: bool },

    /// Some ranks did not reach a collective within the timeout.
    #[error(
        "rank {detected_by} waited {timeout:?} in {op} (call #{call_idx}) for rank(s) {late:?}, which never arrived: \
         they are stalled, deadlocked, or making a different sequence of collective calls; \
         if they are only slow, raise the communicator timeout"
    )]
    Timeout {
        op: &'static str,
        call_idx: u64,
        late: Vec<usize>,
        timeout: Duration,
        detected_by: usize,
    },

    /// MPI: this rank waited past the timeout for the others (MPI cannot tell which is late).
    #[error(
        "rank {detected_by} waited {timeout:?} in {op} (call #{call_idx}) for the other processes: \
         one is stalled, dead, or making a different sequence of collective calls (MPI cannot \
         tell which); if they are only slow, raise the communicator timeout"
    )]
    Stalled {
        op: &'static str,
        call_idx: u64,
        timeout: Duration,
        detected_by: usize,
    },

    /// Ranks made different calls at the same position of their call sequences.
    #[error(
        "mismatched collectives: rank {rank_a} called {call_a} but rank {rank_b} called {call_b}; \
         every rank must make the same calls with the same element type, lengths, op and root"
    )]
    Mismatch {
        rank_a: usize,
        call_a: String,
        rank_b: usize,
        call_b: String,
    },

    /// A rank called `abort`.
    #[error("rank {rank} aborted the world: {reason}")]
    Aborted { rank: usize, reason: String },

    /// A rank passed buffers that cannot work (bad lengths, mixed element types, root out of range).
    /// This also fails the world, so the other ranks do not wait for a call that will never come.
    #[error("rank {rank} called {op} with bad arguments: {detail}")]
    BadArgs {
        rank: usize,
        op: &'static str,
        detail: String,
    },
}

/// What every collective returns: `Ok`, or the `CommError` that failed the world.
pub type Result<T, E = CommError> = std::result::Result<T, E>;
