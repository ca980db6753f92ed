//! Tensor-parallel serving over MPI processes: `mpirun -n N frugal serve --comm mpi --model M`.
//! Every process loads its share of the model (as `generate --tp --comm mpi` does); rank 0
//! answers HTTP and drives the engine, and each call it makes on its worker (new sequences,
//! prefills, decode steps, forks, frees) is sent to the other ranks on a communicator of its
//! own, so every rank makes the same calls in the same order and meets rank 0 at the same
//! collectives inside each step (`infer::group::Relay`). When the engine stops, an empty
//! message stops the others.

use super::mpi_job::{check_threads, ready, settle, signal_ready, End};
use super::Args;
use anyhow::bail;
use comm::Collective;
use infer::group::{Call, Group, Relay};
use models::Loaded;
use plan_frugal::ServeSetup;

/// Rank 0's side: each call sent to every other rank.
struct MpiRelay {
    link: comm::Mpi,
    ranks: usize,
    stopped: bool,
}

impl MpiRelay {
    fn stop(&mut self) {
        if !std::mem::replace(&mut self.stopped, true) {
            for r in 1..=self.ranks {
                let _ = self.link.send_bytes(&[], r);
            }
        }
    }
}

impl Relay for MpiRelay {
    fn tell(&mut self, call: &Call) {
        let bytes = call.to_bytes();
        for r in 1..=self.ranks {
            // A rank that has gone ends the job (the launcher's doing); a failed send leaves
            // the step's collective to report it.
            let _ = self.link.send_bytes(&bytes, r);
        }
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn end(mut self: Box<Self>) -> Vec<engine::arena::Measured> {
        self.stop();
        Vec::new()
    }
}

impl Drop for MpiRelay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// This process's part: `None` on ranks other than 0 (their loop ran until rank 0 stopped
/// it), rank 0's group otherwise.
pub fn start(
    args: &Args,
    source: Loaded,
    setup: ServeSetup,
) -> anyhow::Result<Option<(Group, End)>> {
    let timeout = engine::world::DEFAULT_TIMEOUT;
    let mut world = comm::Mpi::init(timeout, |why| eprintln!("error: {why}"))?;
    let (rank, size) = (world.rank(), world.world_size());
    let result = (|| -> anyhow::Result<Option<Group>> {
        check_threads(size)?;
        if args.tp != 1 && args.tp != size {
            bail!(
                "--tp {} with --comm mpi: the ranks are the launcher's {size} processes (-n); \
                 leave --tp out",
                args.tp
            );
        }
        models::tp::fp32_units(size, &args.model, &source)?;
        // The worker's collectives and the calls on communicators of their own.
        let tp = world.split(0, rank as u32)?;
        let link = world.split_mpi(0, rank as u32)?;
        // The processes on this machine share its memory (a collective: every rank asks).
        let here = world.node_ranks() as u64;
        let capacity = engine::capacity::host_available().map(|h| h.bytes / here.max(1));
        let config = source.config.clone();
        let mut worker =
            infer::Worker::tensor_parallel(cpu::Cpu::new(), config, setup, tp, capacity)?;
        source.load_whole(&mut worker)?;
        let mut link = link;
        if rank != 0 {
            signal_ready(&mut link)?;
            follow(link, worker)?;
            return Ok(None);
        }
        for r in 1..size {
            ready(&mut link, r)?;
        }
        eprintln!(
            "frugal serve: {size} tensor-parallel ranks (MPI processes), rank 0 planned {} bytes",
            worker.plan.peak_bytes(plan::buffer::Device::Gpu)
        );
        let relay = MpiRelay {
            link,
            ranks: size - 1,
            stopped: false,
        };
        Ok(Some(Group::with_relay(worker, Box::new(relay))))
    })();
    settle(result, world, rank, size, |group, world| {
        (
            group,
            End {
                proxies: Vec::new(),
                world: Some(world),
            },
        )
    })
}

/// A rank other than 0: makes each call rank 0 sends until an empty message.
fn follow(mut link: comm::Mpi, mut worker: infer::Worker) -> anyhow::Result<()> {
    let (mut msg, mut logits) = (Vec::new(), Vec::new());
    loop {
        link.wait_bytes(&mut msg, 0)?;
        if msg.is_empty() {
            return Ok(());
        }
        let call = Call::from_bytes(&msg).ok_or_else(|| {
            anyhow::anyhow!("rank 0 sent {} bytes that are not a call", msg.len())
        })?;
        call.apply(&mut worker, &mut logits);
    }
}
