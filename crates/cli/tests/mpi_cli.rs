//! `frugal train --comm mpi` under `mpiexec` (built with `--features mpi`; `.ci/run` installs
//! MPICH and runs `cargo test --release -p frugal --features mpi --test mpi_cli`): losses and
//! bytes on the wire bit-identical to thread ranks at every ZeRO stage and under tensor,
//! sequence and pipeline parallelism, snapshots that move
//! between MPI and thread ranks, and a rank that dies or stalls ends the job instead of hanging
//! it. Without the feature, `--comm mpi` is refused with how to build it.

mod common;

use common::frugal;

#[cfg(not(feature = "mpi"))]
#[test]
fn comm_mpi_without_the_feature_says_how_to_build_it() {
    let out = frugal(&["train", "--comm", "mpi", "--steps", "1"]);
    common::fails_with(&out, "--features mpi");
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::*;
    use common::small_text;
    use serde_json::Value;
    use std::process::{Command, Output};
    use std::time::{Duration, Instant};

    /// This test's own slice of the corpus (tests run side by side; each folder is recreated).
    fn data(test: &str) -> String {
        small_text("mpi-cli", &format!("data-{test}"), 40_000)
    }

    /// The tiny run both launchers train, with `extra` flags (overriding the same flags here).
    fn run_args(data: &str, extra: &[&str]) -> Vec<String> {
        let base = [
            ("--model", "gpt2-tiny"),
            ("--steps", "4"),
            ("--batch", "2"),
            ("--seq", "32"),
            ("--data", data),
            ("--sample-tokens", "0"),
            ("--val-batches", "1"),
            ("--val-every", "4"),
        ];
        let mut args = vec!["train".to_string(), "--json".to_string()];
        for (flag, value) in base.into_iter().filter(|(f, _)| !extra.contains(f)) {
            args.extend([flag.to_string(), value.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// `mpiexec`, also allowed to oversubscribe and to run as root should it be Open MPI's
    /// (MPICH, which `.ci/run` installs, needs neither and ignores the variables).
    fn launcher() -> Command {
        let mut c = Command::new("mpiexec");
        c.env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        c
    }

    fn mpiexec(n: usize, args: &[String]) -> Output {
        launcher()
            .args(["-n", &n.to_string(), env!("CARGO_BIN_EXE_frugal")])
            .args(args.iter().map(String::as_str).take(1))
            .args(["--comm", "mpi"])
            .args(args.iter().map(String::as_str).skip(1))
            .output()
            .expect("mpiexec runs (apt install mpich)")
    }

    fn threads(n: usize, args: &[String]) -> Output {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        let ranks = n.to_string();
        all.extend(["--ranks", &ranks]);
        frugal(&all)
    }

    fn json(out: &Output) -> Value {
        common::json(out)
    }

    /// What must agree bit for bit between the two launchers.
    fn outcome(v: &Value) -> (Value, Value, Value, Value) {
        let comm = v["zero"]["comm_sent_bytes_per_step"].clone();
        let planned = v["ranks"][0]["planned"]["peak_bytes"].clone();
        (v["loss_last"].clone(), v["val_loss"].clone(), comm, planned)
    }

    #[test]
    fn three_mpi_processes_generate_the_tokens_of_three_thread_ranks() {
        // SmolLM2's 9 heads and 3 key/value heads over 3 processes.
        let model = common::smollm2();
        let prompt = "The history of Rome";
        let args: Vec<String> =
            common::generate_args(model.to_str().unwrap(), prompt, "16", &["--json"])
                .iter()
                .map(|s| s.to_string())
                .collect();
        let over_mpi = json(&mpiexec(3, &args));
        let mut threads: Vec<&str> = args.iter().map(String::as_str).collect();
        threads.extend(["--tp", "3"]);
        let over_threads = json(&frugal(&threads));
        assert_eq!(over_mpi["tokens"], over_threads["tokens"]);
        assert_eq!(over_mpi["tp"], 3);
        for (r, rank) in over_mpi["ranks"].as_array().unwrap().iter().enumerate() {
            assert_eq!(
                rank["planned"]["peak_bytes"], rank["measured"]["peak_bytes"],
                "rank {r}"
            );
            assert_eq!(
                rank["measured"]["peak_bytes"],
                over_threads["ranks"][r]["measured"]["peak_bytes"]
            );
        }
    }

    #[test]
    fn two_and_four_mpi_processes_generate_as_two_and_four_thread_ranks() {
        // A Llama with 4 query heads over 2 key/value heads: at 4 ranks each KV head is
        // replicated on two; DeepSeek's latent attention and experts at 2. Trained a few steps
        // here, saved, then split.
        let data = data("tp-generate");
        for (preset, ranks) in [("llama-tiny", &[2usize, 4][..]), ("deepseek-tiny", &[2])] {
            let out = common::temp_dir("mpi-cli", "tp-generate").join(preset);
            generate_as_thread_ranks(&data, preset, out.to_str().unwrap(), ranks);
        }
    }

    /// Trains `preset` into `out`, then generates from it on `ranks` MPI processes and as many
    /// thread ranks: the same tokens, every rank's plan measured, the same bytes.
    fn generate_as_thread_ranks(data: &str, preset: &str, out_s: &str, ranks: &[usize]) {
        let train = run_args(data, &["--model", preset, "--out", out_s]);
        json(&frugal(
            &train.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
        for &n in ranks {
            let args: Vec<String> = common::generate_args(out_s, "ROMEO:", "12", &["--json"])
                .iter()
                .map(|s| s.to_string())
                .collect();
            let over_mpi = json(&mpiexec(n, &args));
            let mut threads: Vec<&str> = args.iter().map(String::as_str).collect();
            let tp = n.to_string();
            threads.extend(["--tp", &tp]);
            let over_threads = json(&frugal(&threads));
            assert_eq!(
                over_mpi["tokens"], over_threads["tokens"],
                "{preset} {n} ranks"
            );
            assert_eq!(over_mpi["tp"], n);
            let ranks = over_mpi["ranks"].as_array().unwrap();
            for (r, rank) in ranks.iter().enumerate() {
                assert_eq!(rank["planned"], rank["measured"], "{n} ranks, rank {r}");
                assert_eq!(rank["measured"], over_threads["ranks"][r]["measured"]);
            }
        }
    }

    #[test]
    fn mpi_processes_send_and_receive_bytes_point_to_point() {
        // bench comm checks every message byte for byte on arrival and fails otherwise.
        let args: Vec<String> = ["bench", "comm", "--mib", "1", "--reps", "2", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = launcher()
            .args(["-n", "2", env!("CARGO_BIN_EXE_frugal")])
            .args(&args[..2])
            .args(["--comm", "mpi"])
            .args(&args[2..])
            .output()
            .expect("mpiexec runs (apt install mpich)");
        let v = json(&out);
        assert_eq!(v["ranks"], 2);
        assert!(v["send_recv_s"].as_f64().unwrap() > 0.0, "{v}");
    }

    #[test]
    fn mpi_ranks_train_bit_identically_to_thread_ranks_at_every_stage() {
        let data = data("parity");
        let cases: [(usize, &[&str]); 8] = [
            (2, &["--zero", "0"]),
            (2, &["--zero", "1"]),
            (2, &["--zero", "2"]),
            (2, &["--zero", "3", "--overlap-comm", "false"]),
            (2, &["--zero", "3", "--overlap-comm", "true"]),
            (
                2,
                &[
                    "--zero",
                    "3",
                    "--overlap-comm",
                    "true",
                    "--precision",
                    "bf16",
                ],
            ),
            (3, &["--zero", "3", "--recompute", "full"]),
            (
                2,
                &["--zero", "2", "--precision", "bf16", "--grad-accum", "2"],
            ),
        ];
        for (n, extra) in cases {
            let args = run_args(&data, extra);
            let (m, t) = (json(&mpiexec(n, &args)), json(&threads(n, &args)));
            assert_eq!(outcome(&m), outcome(&t), "n {n} {extra:?}");
            assert!(m["zero"]["comm_sent_bytes_per_step"].as_u64().unwrap() > 0);
            // The prefetch runs on a communication thread where asked (MPICH grants
            // MPI_THREAD_MULTIPLE), in both launchers.
            let overlapped = extra.contains(&"true");
            assert_eq!(m["zero"]["overlap_comm"], overlapped, "{extra:?}");
            assert_eq!(t["zero"]["overlap_comm"], overlapped, "{extra:?}");
            assert_eq!(m["ranks"].as_array().unwrap().len(), n);
            for r in m["ranks"].as_array().unwrap() {
                assert!(
                    r["process_peak_rss_bytes"].as_u64().unwrap() > 0,
                    "VmHWM per process"
                );
                assert_eq!(r["planned"]["peak_bytes"], r["measured"]["peak_bytes"]);
            }
        }
    }

    #[test]
    fn tensor_sequence_and_pipeline_parallel_mpi_ranks_match_thread_ranks() {
        let data = data("parallel");
        let cases: [(usize, &[&str]); 4] = [
            (2, &["--tp", "2", "--sp"]),
            // The data-parallel prefetch on its thread while the tensor-parallel group talks.
            (4, &["--tp", "2", "--zero", "3", "--overlap-comm", "true"]),
            (2, &["--pp", "2", "--grad-accum", "2"]),
            (4, &["--tp", "2", "--pp", "2", "--grad-accum", "2"]),
        ];
        for (n, extra) in cases {
            let args = run_args(&data, extra);
            let (m, t) = (json(&mpiexec(n, &args)), json(&threads(n, &args)));
            assert_eq!(outcome(&m), outcome(&t), "n {n} {extra:?}");
            let ranks = m["ranks"].as_array().unwrap();
            assert_eq!(ranks.len(), n, "{extra:?}");
            for r in ranks {
                assert_eq!(r["planned"], r["measured"], "{extra:?}");
            }
        }
    }

    #[test]
    fn snapshots_move_between_mpi_and_thread_ranks() {
        let data = data("snapshots");
        let dir = common::temp_dir("mpi-cli", "snapshots");
        let whole = json(&threads(
            2,
            &run_args(&data, &["--zero", "1", "--steps", "6"]),
        ));
        for (first_mpi, name) in [(true, "mpi-first"), (false, "threads-first")] {
            let out = dir.join(name);
            let out = out.to_str().unwrap();
            let save = [
                "--zero",
                "3",
                "--steps",
                "6",
                "--save-every",
                "3",
                "--out",
                out,
            ];
            let save = run_args(&data, &save);
            // Interrupt at step 3 by running only three of the six steps' schedule: a second
            // run resumes from the snapshot written at step 3.
            let first = match first_mpi {
                true => mpiexec(2, &save),
                false => threads(2, &save),
            };
            json(&first);
            let snap = format!("{out}/step-000003");
            let resumed = [
                "--zero", "1", "--steps", "6", "--resume", &snap, "--out", out,
            ];
            let resumed = run_args(&data, &resumed);
            let again = match first_mpi {
                true => threads(2, &resumed),
                false => mpiexec(2, &resumed),
            };
            let again = json(&again);
            assert_eq!(again["loss_last"], whole["loss_last"], "{name}");
            assert_eq!(again["val_loss"], whole["val_loss"], "{name}");
        }
    }

    #[test]
    fn ranks_must_match_the_launcher() {
        let args = run_args(&data("ranks"), &["--ranks", "3"]);
        let out = mpiexec(2, &args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("leave --ranks out"), "{err}");
    }

    /// Starts a long MPI run, waits until both processes train, signals one, and returns the
    /// launcher's exit and stderr and how long the job took to end after the signal.
    fn signal_one_rank(signal: i32, seed: &str) -> (Output, Duration) {
        let extra = ["--steps", "100000", "--comm-timeout", "2", "--seed", seed];
        let args = run_args(&data(seed), &extra);
        let child = launcher()
            .args([
                "-n",
                "2",
                env!("CARGO_BIN_EXE_frugal"),
                "train",
                "--comm",
                "mpi",
            ])
            .args(args.iter().skip(1))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The seed marks this test's processes (the tests run side by side).
        let marker = format!("comm-timeout 2 --seed {seed}");
        let started = Instant::now();
        let pids = loop {
            let pgrep = Command::new("pgrep")
                .args(["-f", &marker])
                .output()
                .unwrap();
            let pids: Vec<i32> = String::from_utf8_lossy(&pgrep.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|&p| p != child.id() as i32)
                .collect();
            if pids.len() >= 2 {
                break pids;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = Command::new("kill")
                    .args(["-9", &child.id().to_string()])
                    .status();
                panic!("the ranks never started");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // Let the ranks reach the training loop.
        std::thread::sleep(Duration::from_secs(2));
        // SAFETY: a plain kill(2) of a process this test started.
        unsafe { libc::kill(*pids.iter().max().unwrap(), signal) };
        let t0 = Instant::now();
        let out = child.wait_with_output().unwrap();
        let took = t0.elapsed();
        for p in pids {
            // SAFETY: as above; the processes are gone or stopped, this only cleans up.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        (out, took)
    }

    /// `frugal serve --comm mpi` on `n` processes with `extra` flags, on SmolLM2.
    struct MpiServer {
        child: std::process::Child,
        lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
        port: u16,
    }

    impl MpiServer {
        fn start(n: usize, extra: &[&str]) -> MpiServer {
            use std::io::BufRead;
            let model = common::smollm2();
            let mut child = launcher()
                .args(["-n", &n.to_string(), env!("CARGO_BIN_EXE_frugal")])
                .args(["serve", "--comm", "mpi", "--model", model.to_str().unwrap()])
                .args(["--port", "0", "--ctx", "256"])
                .args(extra)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("mpiexec runs (apt install mpich)");
            let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let first = lines.next().unwrap().unwrap();
            let port = first
                .rsplit("http://127.0.0.1:")
                .next()
                .and_then(|rest| rest.split('/').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no port in {first:?}"));
            MpiServer { child, lines, port }
        }

        fn ask(&self, method: &str, path: &str, body: &str) -> String {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
            write!(
                s,
                "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text.split_once("\r\n\r\n").unwrap().1.to_string()
        }

        /// Greedy answers of three prompts against `generate`'s alone (`weights` its flags).
        fn answers_as_generate(&self, weights: &[&str]) {
            let model = common::smollm2();
            for prompt in [
                "Water boils at",
                "The history of Rome",
                "My favourite book is",
            ] {
                let body =
                    format!(r#"{{"prompt": "{prompt}", "max_tokens": 12, "temperature": 0}}"#);
                let got: Value =
                    serde_json::from_str(&self.ask("POST", "/v1/completions", &body)).unwrap();
                let mut args = vec!["generate", "--model", model.to_str().unwrap()];
                args.extend(["--prompt", prompt, "--max-new-tokens", "12", "--json"]);
                args.extend(weights);
                let alone = json(&frugal(&args));
                assert_eq!(got["choices"][0]["text"], alone["text"], "{prompt}");
            }
        }

        /// SIGTERM to the launcher: rank 0 drains, stops the others, and the job exits 0.
        fn stop(mut self) {
            // SAFETY: a plain kill(2) of the launcher this test started.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let status = self.child.wait().unwrap();
            let rest: Vec<String> = self.lines.map_while(Result::ok).collect();
            assert!(status.success(), "{status:?} {rest:?}");
            assert!(rest
                .iter()
                .any(|l| l.contains("every admitted request answered")));
        }
    }

    /// Two prefill ranks as MPI processes and rank 0 decoding: the greedy answers equal
    /// `generate`'s, every prompt's KV crosses once, and SIGTERM drains and ends the job cleanly.
    #[test]
    fn prefill_ranks_as_mpi_processes_serve_as_one_worker() {
        let server = MpiServer::start(3, &["--prefill-ranks", "2"]);
        server.answers_as_generate(&[]);
        let metrics = server.ask("GET", "/metrics", "");
        assert!(metrics.contains("frugal_kv_shipments_total 3"), "{metrics}");
        server.stop();
    }

    /// Three tensor-parallel MPI processes serving, rank 0 relaying its calls: the greedy
    /// answers of f32 weights equal one worker's (8-bit activations may round a partial sum a
    /// step apart on a rank, as thread ranks' do).
    #[test]
    fn tensor_parallel_mpi_processes_serve_as_one_worker() {
        let server = MpiServer::start(3, &["--weights", "f32"]);
        server.answers_as_generate(&["--weights", "f32"]);
        server.stop();
    }

    #[test]
    fn a_killed_rank_ends_the_job() {
        let (out, took) = signal_one_rank(libc::SIGKILL, "101");
        assert!(!out.status.success(), "the job failed");
        assert!(took < Duration::from_secs(20), "ended after {took:?}");
    }

    #[test]
    fn a_stalled_rank_is_named_and_the_job_ends_within_the_timeout() {
        let (out, took) = signal_one_rank(libc::SIGSTOP, "102");
        assert!(!out.status.success(), "the job failed");
        assert!(took < Duration::from_secs(15), "ended after {took:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("rank(s) [1]") && err.contains("waited 2s"),
            "{err}"
        );
    }
}
