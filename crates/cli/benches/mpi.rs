//! MPI ranks against thread ranks on this machine, side by side in one run: the all-reduce of
//! 64 MiB f32 (`frugal bench comm`: bus GB/s against the memory bandwidth measured in the same
//! process) and the training step of gpt2-mini at ZeRO-2 over 2 ranks (median tokens/s of three
//! runs each). Then ZeRO-3's cost over MPI: gpt2-124m (1 × 128 tokens a rank, one compute thread
//! a process) at stage 0, stage 3 with blocking gathers and stage 3 with the prefetch overlapped
//! (`--overlap-comm`), on 2 and 4 ranks, three interleaved rounds: median tokens/s, the step
//! time over stage 0's, and rank 0's seconds blocked in collectives. No assertions (speed is not
//! a test).
//!
//! Run: `cargo bench -p frugal --features mpi --bench mpi` (needs `mpiexec`; about 6 minutes on
//! 2 cores).

use serde_json::Value;
use std::process::Command;

const FRUGAL: &str = env!("CARGO_BIN_EXE_frugal");

fn json(cmd: &mut Command) -> Value {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn mpi(n: usize) -> Command {
    let mut c = Command::new("mpiexec");
    // Harmless under MPICH; lets Open MPI oversubscribe and run as root.
    c.env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c.args(["-n", &n.to_string(), FRUGAL]);
    c
}

fn main() {
    let comm_args = ["bench", "comm", "--mib", "64", "--json"];
    let threads = json(Command::new(FRUGAL).args(comm_args).args(["--ranks", "2"]));
    let over_mpi = json(mpi(2).args(comm_args).args(["--comm", "mpi"]));
    for (name, v) in [("threads", &threads), ("mpi", &over_mpi)] {
        println!(
            "all-reduce 64 MiB f32, 2 {name} ranks: {:.1} ms, bus {:.2} GB/s = {:.3} of the triad's {:.2} GB/s",
            1e3 * v["all_reduce_s"].as_f64().unwrap(),
            v["bus_bytes_per_s"].as_f64().unwrap() / 1e9,
            v["bus_over_triad"].as_f64().unwrap(),
            v["triad_bytes_per_s"].as_f64().unwrap() / 1e9,
        );
    }
    let train: Vec<&str> = "train --zero 2 --model gpt2-mini --steps 20 --batch 2 --seq 128 \
        --sample-tokens 0 --val-batches 1 --val-every 100 --json"
        .split_whitespace()
        .collect();
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        xs[xs.len() / 2]
    };
    let tps = |v: Value| v["tokens_per_s"].as_f64().unwrap();
    let (mut t, mut m) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        t.push(tps(json(
            Command::new(FRUGAL).args(&train).args(["--ranks", "2"]),
        )));
        m.push(tps(json(
            mpi(2).args(["train", "--comm", "mpi"]).args(&train[1..]),
        )));
    }
    let (t, m) = (median(t), median(m));
    println!(
        "gpt2-mini ZeRO-2, 2 ranks, 20 steps of 2 x 128 tokens per rank: threads {t:.0} tokens/s, \
         mpi {m:.0} tokens/s: mpi / threads = {:.3}",
        m / t
    );
    zero3_overlap();
    println!("CPU: {}", threads["cpu"].as_str().unwrap_or("?"));
}

/// Stage 0, stage 3 blocking and stage 3 overlapped over MPI, on 2 and 4 ranks.
fn zero3_overlap() {
    let train = |zero: &str, overlap: &str| -> Vec<String> {
        let args = format!(
            "train --comm mpi --model gpt2-124m --zero {zero} --overlap-comm {overlap} --steps 4 \
             --batch 1 --seq 128 --sample-tokens 0 --val-batches 1 --val-every 100 --json"
        );
        args.split_whitespace().map(str::to_string).collect()
    };
    let setups = [("0", "false"), ("3", "false"), ("3", "true")];
    for n in [2, 4] {
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); setups.len()];
        for _ in 0..3 {
            for (i, (zero, overlap)) in setups.iter().enumerate() {
                let v = json(
                    mpi(n)
                        .env("RAYON_NUM_THREADS", "1")
                        .args(train(zero, overlap)),
                );
                let tps = v["tokens_per_s"].as_f64().unwrap();
                let blocked = v["zero"]["comm_blocked_s"].as_f64().unwrap();
                runs[i].push((tps, blocked));
            }
        }
        let median = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = xs.iter().map(f).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let stage0 = median(&runs[0], |r| r.0);
        for (i, (zero, overlap)) in setups.iter().enumerate() {
            let tps = median(&runs[i], |r| r.0);
            println!(
                "gpt2-124m over {n} MPI ranks, ZeRO-{zero} overlap {overlap}: {tps:.1} tokens/s \
                 (runs {:?}), step time {:.3}x stage 0's, rank 0 blocked {:.2} s in collectives",
                runs[i].iter().map(|r| r.0.round()).collect::<Vec<_>>(),
                stage0 / tps,
                median(&runs[i], |r| r.1),
            );
        }
    }
}
