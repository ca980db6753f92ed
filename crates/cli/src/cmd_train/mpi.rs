//! `frugal train --comm threads|mpi`: ranks as threads of this process (`--ranks N`, the
//! default) or as processes under an MPI launcher (`mpirun -n N frugal train --comm mpi ...`,
//! one rank per process; a frugal built with `--features mpi`).
//!
//! Under MPI the world size is the launcher's `-n`; every process validates the same flags,
//! builds its own rank and trains it; rank 0 takes `--out`'s lock, prints and writes the model,
//! every rank writes its own snapshot shard into the shared `--out`. A process whose run fails
//! prints its error and ends the job (`MPI_Abort`), so no other rank waits for it. On several
//! machines, `--out`, `--data` and `--model` must name the same files on each (a shared
//! filesystem), and the launcher places the processes: `mpirun -n 8 -f hosts` with one process
//! per socket or node and `RAYON_NUM_THREADS` set to its cores.
//!
//! Example: `mpirun -n 2 frugal train --comm mpi --zero 3 --steps 20`.

use super::Args;
use std::str::FromStr;

/// `--overlap-comm`: whether ZeRO-3's data-parallel collectives run on a thread of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// On when this node runs no more ranks than it has cores: beside more, the communication
    /// thread competes with the computation (measured slower at 4 MPI ranks on 2 cores).
    Auto,
    On,
    Off,
}

impl Overlap {
    /// The choice for a node that runs `node_ranks` ranks.
    pub fn resolve(self, node_ranks: usize) -> bool {
        match self {
            Overlap::On => true,
            Overlap::Off => false,
            Overlap::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                node_ranks <= cores
            }
        }
    }
}

impl FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Overlap::Auto),
            "true" | "on" => Ok(Overlap::On),
            "false" | "off" => Ok(Overlap::Off),
            _ => Err("use auto (on when this node has a core for each rank), true or false".into()),
        }
    }
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Overlap::Auto => "auto",
            Overlap::On => "true",
            Overlap::Off => "false",
        })
    }
}

/// Runs this process's rank of an MPI job.
#[cfg(feature = "mpi")]
pub fn run(mut args: Args) -> anyhow::Result<()> {
    use comm::Collective;
    let timeout = std::time::Duration::from_secs(args.comm_timeout);
    let comm = comm::Mpi::init(timeout, |why| eprintln!("error: {why}"))?;
    let (rank, size) = (comm.rank(), comm.world_size());
    if args.ranks != 1 && args.ranks as usize != size {
        anyhow::bail!(
            "--ranks {} with --comm mpi: the ranks are mpirun's {size} processes (-n); leave \
             --ranks out",
            args.ranks
        );
    }
    args.ranks = size as u32;
    // Every process asks how many of the job's processes share its node (a collective).
    let node_ranks = comm.node_ranks();
    let overlap = args.overlap_comm.resolve(node_ranks);
    args.overlap_comm = match overlap && !comm::Mpi::thread_multiple() {
        true => {
            // An endpoint may not move to a communication thread: the collectives stay blocking.
            if rank == 0 {
                eprintln!(
                    "note: this MPI library did not grant MPI_THREAD_MULTIPLE; --overlap-comm false"
                );
            }
            Overlap::Off
        }
        false if overlap => Overlap::On,
        false => Overlap::Off,
    };
    let result = super::run_on(args, Some(Box::new(comm)));
    if let Err(e) = &result {
        if size > 1 {
            eprintln!("error: rank {rank}: {e:#}");
            comm::Mpi::abort_world(2);
        }
    }
    comm::Mpi::finalize();
    result
}

/// Without the feature: the flag is known, the backend is not built in.
#[cfg(not(feature = "mpi"))]
pub fn run(_: Args) -> anyhow::Result<()> {
    anyhow::bail!(
        "--comm mpi: this frugal was built without MPI; build it with `cargo build --release \
         --features mpi -p frugal` (needs an MPI library and libclang: apt install libmpich-dev \
         libclang-dev) and run it under `mpirun -n N`"
    )
}
