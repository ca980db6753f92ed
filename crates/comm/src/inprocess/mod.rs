//! The in-process backend: N ranks as threads of one process, sharing memory. The embedded
//! default behind `frugal train --ranks N`.
//!
//! Holds the constructor (`InProcess::world`) and options; the per-rank handle is in `rank`,
//! the shared barrier state in `world`. No data is staged: at each collective every rank posts
//! its buffers' addresses, and each rank then reads the others' buffers directly, so an
//! all-reduce allocates nothing and each rank reduces only its own 1/N of the buffer.
//!
//! ```
//! use comm::{InProcess, InProcessOptions};
//! use std::time::Duration;
//! let ranks = InProcess::world_with(4, &InProcessOptions { timeout: Duration::from_secs(5) }).unwrap();
//! assert_eq!(ranks.len(), 4);
//! assert!(InProcess::world(0).is_err());
//! ```

mod rank;
mod world;

pub use rank::InProcessComm;

use crate::{CommError, Result};
use std::sync::Arc;
use std::time::Duration;

/// Settings shared by every rank of an in-process world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProcessOptions {
    /// How long a rank waits at a collective for the others to arrive before it fails the
    /// world with `CommError::Timeout` naming the ranks that did not come.
    pub timeout: Duration,
}

impl Default for InProcessOptions {
    fn default() -> Self {
        InProcessOptions {
            timeout: Duration::from_secs(60),
        }
    }
}

/// Builds in-process worlds.
pub struct InProcess;

impl InProcess {
    /// One handle per rank (index = rank), with the default 60 s timeout. Move each into its
    /// own thread; dropping a handle (e.g. when its thread panics) fails the world.
    pub fn world(n_ranks: usize) -> Result<Vec<InProcessComm>> {
        Self::world_with(n_ranks, &InProcessOptions::default())
    }

    pub fn world_with(n_ranks: usize, options: &InProcessOptions) -> Result<Vec<InProcessComm>> {
        if n_ranks == 0 {
            return Err(CommError::EmptyWorld);
        }
        let world = Arc::new(world::World::new(n_ranks, options.timeout));
        Ok((0..n_ranks)
            .map(|rank| InProcessComm::new(Arc::clone(&world), rank))
            .collect())
    }
}
