//! `frugal bench comm`: the all-reduce the engine's ZeRO stage 0 runs, on thread ranks
//! (`--ranks N`) or MPI processes (`mpirun -n N frugal bench comm --comm mpi`), against the
//! memory bandwidth measured in the same run (a streaming triad over buffers of the same size):
//! one-process ranks move bytes through memory, so that is their ceiling. Reports the median
//! seconds of an all-reduce of `--mib` MiB of f32, its algorithm bandwidth (size / time) and
//! bus bandwidth (2(N−1)/N · size / time, NCCL's convention), and the bus bandwidth over the
//! triad's; and a point-to-point transfer of the same bytes between ranks 0 and 1 (the
//! send/receive prefill/decode disaggregation ships KV with), checked byte for byte.
//!
//! Example: `mpirun -n 2 frugal bench comm --comm mpi --mib 64 --json`.

use comm::{Collective, ReduceOp};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Buffer size in MiB of f32.
    #[arg(long, default_value_t = 64)]
    pub mib: usize,
    /// threads (--ranks in this process) or mpi (under mpirun -n N).
    #[arg(long, default_value = "threads")]
    pub comm: comm::Transport,
    /// Thread ranks (with --comm threads).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Timed all-reduces (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    #[arg(long)]
    pub json: bool,
}

/// Median seconds of `reps` all-reduces of `n` f32 on `c` (every rank calls it).
fn time_all_reduce(c: &mut dyn Collective, n: usize, reps: usize) -> anyhow::Result<f64> {
    let mut buf = vec![c.rank() as f32 + 1.0; n];
    c.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum)?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        c.barrier()?;
        let t0 = Instant::now();
        c.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    // Every rank's median, the slowest counted (the collective ends when the last rank does).
    times.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let median = times[reps / 2] as f32;
    Ok(f64::from(c.all_reduce_f32(median, ReduceOp::Max)?))
}

/// Median seconds of one point-to-point transfer of `n` bytes (half a ping-pong between ranks
/// 0 and 1; the others wait), each message checked byte for byte on arrival.
fn time_send_recv(c: &mut dyn Collective, n: usize, reps: usize) -> anyhow::Result<f64> {
    let message: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
    let mut back = vec![0u8; n];
    let mut times = Vec::with_capacity(reps);
    for _ in 0..=reps {
        c.barrier()?;
        let t0 = Instant::now();
        match c.rank() {
            0 => {
                c.send_bytes(&message, 1)?;
                c.recv_bytes(&mut back, 1)?;
                anyhow::ensure!(back == message, "rank 0 got back other bytes than it sent");
            }
            1 => {
                c.recv_bytes(&mut back, 0)?;
                anyhow::ensure!(back == message, "rank 1 got other bytes than rank 0 sent");
                c.send_bytes(&back, 0)?;
            }
            _ => {}
        }
        times.push(t0.elapsed().as_secs_f64() / 2.0);
    }
    times.remove(0);
    times.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let median = times[reps / 2] as f32;
    Ok(f64::from(c.all_reduce_f32(median, ReduceOp::Max)?))
}

/// The all-reduce's and the point-to-point transfer's median seconds.
fn time_both(c: &mut dyn Collective, n: usize, reps: usize) -> anyhow::Result<(f64, f64)> {
    let all_reduce = time_all_reduce(c, n, reps)?;
    Ok((all_reduce, time_send_recv(c, 4 * n, reps)?))
}

/// A triad over three buffers of `n` f32 (read 2, write 1): bytes per second.
fn triad_bandwidth(n: usize) -> f64 {
    let (b, c) = (vec![1.0f32; n], vec![2.0f32; n]);
    let mut a = vec![0.0f32; n];
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        kernels::stream::triad(&mut a, &b, &c, 0.5);
        best = best.min(t0.elapsed());
    }
    std::hint::black_box(&a);
    (12 * n) as f64 / best.as_secs_f64()
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.mib > 0 && a.reps > 0,
        "--mib and --reps must be at least 1"
    );
    // The buffer and the triad's three of its size live at once: refuse what cannot fit.
    let needed = (a.mib as u64).saturating_mul(4 << 20);
    if let Some(host) = engine::capacity::host_available() {
        anyhow::ensure!(
            needed <= host.bytes,
            "--mib {}: the all-reduce and the triad need {} MiB of host RAM, {} MiB are \
             available; use a smaller --mib",
            a.mib,
            needed >> 20,
            host.bytes >> 20
        );
    }
    let n = (a.mib << 20) / 4;
    anyhow::ensure!(
        a.comm == comm::Transport::Mpi || a.ranks >= 2,
        "--ranks {}: the transfers need at least two ranks",
        a.ranks
    );
    let (world, (seconds, p2p), triad) = match a.comm {
        comm::Transport::Threads => {
            let triad = triad_bandwidth(n);
            let timeout = engine::world::DEFAULT_TIMEOUT;
            let run = |mut c: Box<dyn Collective>| time_both(&mut c, n, a.reps);
            let mut all = engine::world::launch(a.ranks, timeout, run, |_| false)?;
            (a.ranks, all.swap_remove(0), triad)
        }
        comm::Transport::Mpi => mpi_seconds(n, a.reps)?,
    };
    if let (comm::Transport::Mpi, Some(false)) = (a.comm, rank0()) {
        return Ok(());
    }
    let size = (4 * n) as f64;
    let bus = 2.0 * (world - 1) as f64 / world as f64 * size / seconds;
    if a.json {
        let v = json!({
            "comm": format!("{:?}", a.comm).to_lowercase(), "ranks": world, "bytes": 4 * n,
            "all_reduce_s": seconds, "algo_bytes_per_s": size / seconds, "bus_bytes_per_s": bus,
            "triad_bytes_per_s": triad, "bus_over_triad": bus / triad,
            "send_recv_s": p2p, "send_recv_bytes_per_s": size / p2p,
            "cpu": crate::generate::cpu_name(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "all-reduce of {} MiB f32 over {world} {:?} ranks: {:.1} ms, {:.2} GB/s algorithm, \
             {:.2} GB/s bus = {:.2} of the triad's {:.2} GB/s (CPU: {})",
            a.mib,
            a.comm,
            1e3 * seconds,
            size / seconds / 1e9,
            bus / 1e9,
            bus / triad,
            triad / 1e9,
            crate::generate::cpu_name()
        );
        println!(
            "send/receive of {} MiB between ranks 0 and 1: {:.1} ms, {:.2} GB/s (each message \
             checked byte for byte)",
            a.mib,
            1e3 * p2p,
            size / p2p / 1e9
        );
    }
    Ok(())
}

thread_local! {
    static RANK0: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Under MPI, whether this process is rank 0 (`None` before MPI ran).
fn rank0() -> Option<bool> {
    RANK0.with(|r| r.get())
}

/// Under MPI: the world size, the all-reduce's seconds, and the triad measured by rank 0 alone
/// (the others wait at a barrier, as the thread case measures it with nothing else running).
#[cfg(feature = "mpi")]
fn mpi_seconds(n: usize, reps: usize) -> anyhow::Result<(usize, (f64, f64), f64)> {
    let report = |why: &str| eprintln!("error: {why}");
    let mut c = comm::Mpi::init(engine::world::DEFAULT_TIMEOUT, report)?;
    RANK0.with(|r| r.set(Some(c.rank() == 0)));
    let world = c.world_size();
    let triad = match c.rank() {
        0 => triad_bandwidth(n),
        _ => 0.0,
    };
    c.barrier()?;
    anyhow::ensure!(
        world >= 2,
        "the transfers need at least two ranks (mpirun -n 2 or more)"
    );
    let seconds = time_both(&mut c, n, reps)?;
    drop(c);
    comm::Mpi::finalize();
    Ok((world, seconds, triad))
}

#[cfg(not(feature = "mpi"))]
fn mpi_seconds(_: usize, _: usize) -> anyhow::Result<(usize, (f64, f64), f64)> {
    anyhow::bail!("--comm mpi: this frugal was built without MPI (cargo build --release --features mpi -p frugal)")
}
