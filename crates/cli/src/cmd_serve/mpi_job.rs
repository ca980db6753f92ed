//! What serving over MPI processes shares (`pd_mpi`, `tp_mpi`): the thread level it needs, each
//! rank telling rank 0 it has loaded before rank 0 listens, the other ranks outliving the
//! launcher's signals, and the job's end (MPI finalised after rank 0's helpers stop; an error
//! on any rank ends every process with its reason).

use anyhow::{bail, Context};
use comm::Collective;
use std::sync::Arc;

/// Rank 0's proxy threads and the world endpoint, kept until the engine has stopped; dropping
/// it waits for the proxies (they stop their ranks once the engine is gone) and ends MPI.
pub struct End {
    pub(super) proxies: Vec<std::thread::JoinHandle<()>>,
    pub(super) world: Option<comm::Mpi>,
}

impl End {
    /// After the engine has stopped: the other ranks stopped, and MPI ended.
    pub fn finish(self) {}
}

impl Drop for End {
    fn drop(&mut self) {
        for p in self.proxies.drain(..) {
            let _ = p.join();
        }
        drop(self.world.take());
        comm::Mpi::finalize();
    }
}

/// Serving moves endpoints between threads (rank 0's engine and proxy threads).
pub(super) fn check_threads(size: usize) -> anyhow::Result<()> {
    if size > 1 && !comm::Mpi::thread_multiple() {
        bail!(
            "this MPI library did not grant MPI_THREAD_MULTIPLE, which serving over MPI \
             processes needs (MPICH grants it); serve with thread ranks instead"
        );
    }
    Ok(())
}

/// A rank other than 0, loaded: ignores the launcher's SIGTERM and Ctrl-C (rank 0 drains and
/// then stops it) and tells rank 0 it is ready.
pub(super) fn signal_ready(link: &mut comm::Mpi) -> anyhow::Result<()> {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register(signal, seen.clone())
            .context("installing the SIGTERM/SIGINT handlers")?;
    }
    link.send_bytes(b"ready", 0)?;
    Ok(())
}

/// Rank 0 waits, without a deadline (a large model loads for minutes), for rank `from` to be
/// ready; a rank that fails to load ends the job instead.
pub(super) fn ready(link: &mut comm::Mpi, from: usize) -> anyhow::Result<()> {
    let mut msg = Vec::new();
    link.wait_bytes(&mut msg, from)?;
    if msg != b"ready" {
        bail!(
            "rank {from} sent {} bytes instead of its ready message",
            msg.len()
        );
    }
    Ok(())
}

/// How a process's part of the job began: rank 0's (`wrap`ped with the world endpoint, which
/// lives until the server stops), another rank's that has finished (MPI ended here), or an
/// error, which ends the job with its reason (every other rank waits on this one).
pub(super) fn settle<T, R>(
    result: anyhow::Result<Option<T>>,
    world: comm::Mpi,
    rank: usize,
    size: usize,
    wrap: impl FnOnce(T, comm::Mpi) -> R,
) -> anyhow::Result<Option<R>> {
    match result {
        Ok(Some(lead)) => Ok(Some(wrap(lead, world))),
        Ok(None) => {
            drop(world);
            comm::Mpi::finalize();
            Ok(None)
        }
        Err(e) => {
            if size > 1 {
                eprintln!("error: rank {rank}: {e:#}");
                comm::Mpi::abort_world(2);
            }
            drop(world);
            comm::Mpi::finalize();
            Err(e)
        }
    }
}
