//! The rank launcher: one call runs a closure on every rank of a data-parallel world and gives
//! back the ranks' results in rank order, or the error that caused the failure.
//!
//! Today a rank is a thread of this process joined by `comm::InProcess` (a world of one gets
//! `comm::Solo`); an MPI job's processes are ranks too, each joining with its own `comm::Mpi` (built in the CLI), and run the same closure body. The closure receives the
//! rank's communicator and builds everything else itself (its trainer, its data shard), so the
//! CLI, the tests and the benches share this one harness instead of spawning threads each.
//!
//! When ranks fail, the error returned is the root cause: a rank's own error rather than the
//! "rank k died" its neighbours see as a consequence (`is_consequence` tells them apart), and a
//! panic becomes [`RankPanicked`] naming the rank.
//!
//! Example:
//! ```
//! use comm::Collective;
//! let ranks = engine::world::launch(3, engine::world::DEFAULT_TIMEOUT, |mut c| {
//!     let mut x = [c.rank() as f32];
//!     c.all_reduce(x.as_mut_slice().into(), comm::ReduceOp::Sum)?;
//!     Ok::<f32, engine::EngineError>(x[0])
//! }, engine::world::comm_failure).unwrap();
//! assert_eq!(ranks, vec![3.0, 3.0, 3.0]);
//! ```

use crate::error::EngineError;
use comm::{Collective, InProcess, InProcessOptions};
use std::time::Duration;

/// How long a rank waits at a collective for the others (the in-process default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A rank's thread panicked (a programmer error inside it); `message` is the panic's text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rank {rank} panicked: {message}")]
pub struct RankPanicked {
    pub rank: usize,
    pub message: String,
}

/// Whether `err` is only another rank's failure seen through a collective.
pub fn comm_failure(err: &EngineError) -> bool {
    matches!(err, EngineError::Comm(_))
}

/// The communicators of a world of `ranks` ranks, in rank order.
pub fn communicators(
    ranks: usize,
    timeout: Duration,
) -> Result<Vec<Box<dyn Collective>>, comm::CommError> {
    if ranks == 1 {
        return Ok(vec![Box::new(comm::Solo::new())]);
    }
    let options = InProcessOptions { timeout };
    let world = InProcess::world_with(ranks, &options)?;
    Ok(world
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Collective>)
        .collect())
}

/// Runs `f` on every rank of a world of `ranks` (one thread each; a world of one runs on the
/// calling thread) and returns the results in rank order, or the root cause of a failure.
pub fn launch<T, E, F>(
    ranks: usize,
    timeout: Duration,
    f: F,
    is_consequence: fn(&E) -> bool,
) -> Result<Vec<T>, E>
where
    T: Send,
    E: Send + From<RankPanicked> + From<comm::CommError>,
    F: Fn(Box<dyn Collective>) -> Result<T, E> + Sync,
{
    let comms = communicators(ranks, timeout)?;
    if ranks == 1 {
        let only = comms.into_iter().next().expect("a world of one");
        return f(only).map(|t| vec![t]);
    }
    let results: Vec<Result<T, E>> = std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|payload| {
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(RankPanicked { rank, message }.into())
                })
            })
            .collect()
    });
    root_cause(results, is_consequence)
}

/// Every result, or the first error that is not a consequence of another (else the first).
fn root_cause<T, E>(
    results: Vec<Result<T, E>>,
    is_consequence: fn(&E) -> bool,
) -> Result<Vec<T>, E> {
    if results.iter().all(Result::is_ok) {
        return Ok(results
            .into_iter()
            .map(|r| r.ok().expect("all ok"))
            .collect());
    }
    let mut errors: Vec<E> = results.into_iter().filter_map(Result::err).collect();
    let root = errors.iter().position(|e| !is_consequence(e)).unwrap_or(0);
    Err(errors.swap_remove(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_rank_is_named_not_its_neighbours() {
        let err = launch(
            3,
            Duration::from_secs(10),
            |mut c| {
                if c.rank() == 1 {
                    return Err(EngineError::Data("rank 1's own trouble".into()));
                }
                c.barrier()?;
                Ok(())
            },
            comm_failure,
        )
        .unwrap_err();
        assert!(err.to_string().contains("rank 1's own trouble"), "{err}");
        let panicked = launch(
            2,
            Duration::from_secs(10),
            |mut c| {
                if c.rank() == 0 {
                    panic!("boom");
                }
                c.barrier()?;
                Ok(())
            },
            comm_failure,
        )
        .unwrap_err();
        assert!(
            panicked.to_string().contains("rank 0 panicked: boom"),
            "{panicked}"
        );
    }
}
