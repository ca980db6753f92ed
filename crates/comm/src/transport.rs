//! How a command's ranks talk to each other: `--comm threads|mpi`.

use std::str::FromStr;

/// How ranks talk to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Threads of this process over shared memory (`--ranks N`).
    Threads,
    /// One process per rank under an MPI launcher.
    Mpi,
}

impl FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "threads" => Ok(Transport::Threads),
            "mpi" => Ok(Transport::Mpi),
            _ => Err("use threads (ranks as threads, --ranks N) or mpi (mpirun -n N)".into()),
        }
    }
}
