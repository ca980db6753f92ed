//! `frugal bench serve --http`: the seeded trace of `bench serve` sent to a real `frugal serve`
//! over HTTP on 127.0.0.1, as vLLM's `benchmark_serving` drives a server: every request at once,
//! streamed, each prompt the trace's random tokens as text, `ignore_eos` so each answer has the
//! trace's length. Reports throughput, time to first token and time per output token (p50,
//! p99), the paged KV cache's waste (sampled from `/metrics` twice a second), with a progress
//! line while it runs; bounded by `--timeout`. The server is this binary,
//! started on a free port and stopped with SIGTERM.
//!
//! Example: `frugal bench serve --http --model SmolLM2-135M-Instruct.Q4_1.gguf --requests 16`.

use crate::generate::cpu_name;
use crate::serve::{percentile, trace, Args};
use anyhow::{bail, Context};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one streamed request saw.
struct Seen {
    /// Seconds from sending to the first text, and to the last.
    first_s: f64,
    last_s: f64,
    /// Pieces of text received (one per token, or fewer when a character spans tokens).
    pieces: usize,
    error: Option<String>,
}

/// Sends one streaming completion and times its pieces.
fn one(port: u16, body: &str, deadline: Instant) -> Seen {
    let started = Instant::now();
    let mut seen = Seen {
        first_s: 0.0,
        last_s: 0.0,
        pieces: 0,
        error: None,
    };
    let result = (|| -> anyhow::Result<()> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))?;
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut status = String::new();
        let mut r = BufReader::new(s);
        r.read_line(&mut status)?;
        if !status.contains(" 200 ") {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut r, &mut rest);
            bail!("{} {}", status.trim(), rest.lines().last().unwrap_or(""));
        }
        for line in r.lines() {
            let line = line?;
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(data)?;
            if let Some(e) = v.get("error") {
                bail!("{e}");
            }
            if v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                let t = started.elapsed().as_secs_f64();
                if seen.pieces == 0 {
                    seen.first_s = t;
                }
                seen.last_s = t;
                seen.pieces += 1;
            }
        }
        Ok(())
    })();
    seen.error = result.err().map(|e| format!("{e:#}"));
    seen
}

/// Starts `frugal serve` for `a` on a free port; returns the child and its port.
fn start_server(
    a: &Args,
    context: u64,
    kv_tokens: u64,
) -> anyhow::Result<(std::process::Child, u16)> {
    let exe = std::env::current_exe().context("finding this binary to start the server")?;
    let mut child = Command::new(exe)
        .args(["serve", "--model", &a.model, "--port", "0", "--queue"])
        .arg(a.requests.to_string())
        .args([
            "--ctx",
            &context.to_string(),
            "--max-seqs",
            &a.max_seqs.to_string(),
        ])
        .args([
            "--kv-tokens",
            &kv_tokens.to_string(),
            "--kv-dtype",
            &a.kv_dtype,
        ])
        .args(["--weights", &a.weights])
        .args(
            // Only a grouped format (int4, nf4) takes a group.
            plan_frugal::WeightFormat::parse(&a.weights, Some(a.weight_group))
                .ok()
                .and_then(|f| f.group())
                .map(|g| ["--weight-group".to_string(), g.to_string()])
                .into_iter()
                .flatten(),
        )
        .args(["--prefill-ranks", &a.prefill_ranks.to_string()])
        .args(["--tp", &a.tp.to_string()])
        .args(["--decode-ranks", &a.decode_ranks.to_string()])
        .args(
            a.prefill_threads
                .iter()
                .flat_map(|t| ["--prefill-threads".to_string(), t.to_string()]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting frugal serve")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("the server's output")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let port = line
        .rsplit("http://127.0.0.1:")
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok());
    match port {
        Some(p) => Ok((child, p)),
        None => {
            let _ = child.kill();
            let mut err = String::new();
            if let Some(e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut BufReader::new(e), &mut err);
            }
            bail!("frugal serve did not start: {}", err.trim())
        }
    }
}

/// One counter of the server's `/metrics` (0 when absent or unreadable).
fn metric(port: u16, name: &str) -> f64 {
    let read = || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut s, &mut text)?;
        Ok(text)
    };
    read()
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// Requests one run sends at once, each on a connection and a thread of its own.
const MAX_REQUESTS: usize = 1024;

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.requests > MAX_REQUESTS {
        bail!(
            "--requests {} with --http: every request is sent at once on its own connection; \
             give at most {MAX_REQUESTS}",
            a.requests
        );
    }
    let source = models::ModelSource::at(std::path::Path::new(&a.model)).context(
        "--http serves a model on disk (a GGUF file, an HF folder or a training --out): give --model PATH",
    )?;
    let tok = source.tokenizer()?;
    let shape = source.load()?.config.shape;
    let context = a.context.unwrap_or(1024).min(shape.max_positions);
    let requests = trace(&a, u64::from(tok.vocab_size()).min(shape.vocab), context);
    let kv_tokens = a.max_seqs * context;
    let (mut server, port) = start_server(&a, context, kv_tokens)?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let started = Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for (i, r) in requests.iter().enumerate() {
        // The trace's tokens as text; the server tokenizes it again (lengths may shift a little).
        let text = tok.decode_text(&r.prompt).unwrap_or_default();
        let body = json!({"prompt": text, "max_tokens": r.max_new, "temperature": 0,
                          "stream": true, "ignore_eos": true, "seed": i})
        .to_string();
        let tx = done_tx.clone();
        let sent = std::thread::Builder::new().spawn(move || {
            let _ = tx.send((i, one(port, &body, deadline)));
        });
        if let Err(e) = sent {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
            let _ = server.wait();
            bail!("starting client {i}: {e}: send fewer --requests");
        }
    }
    drop(done_tx);
    let mut seen: Vec<Option<Seen>> = (0..requests.len()).map(|_| None).collect();
    let mut last_progress = Instant::now();
    let (mut last_sample, mut waste) = (Instant::now(), Vec::new());
    while seen.iter().any(Option::is_none) {
        match done_rx.recv_timeout(Duration::from_millis(200)) {
            Ok((i, s)) => seen[i] = Some(s),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(_) => {}
        }
        if last_sample.elapsed() >= Duration::from_millis(500) {
            // Paged waste: the used blocks' slots no token fills; contiguous caches would hold
            // the whole context for every running request.
            let used = metric(port, "frugal_kv_blocks_used");
            let slots = used * metric(port, "frugal_kv_block_size_tokens");
            let tokens = metric(port, "frugal_kv_tokens_cached");
            let whole = metric(port, "frugal_requests_running") * context as f64;
            if slots > 0.0 && whole > 0.0 {
                waste.push((1.0 - tokens / slots, 1.0 - tokens / whole));
            }
            last_sample = Instant::now();
        }
        if last_progress.elapsed() >= Duration::from_secs(2) {
            let n = seen.iter().filter(|s| s.is_some()).count();
            eprintln!(
                "  {n}/{} requests answered, {:.0} s",
                requests.len(),
                started.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let shipped = metric(port, "frugal_kv_shipped_bytes_total") as u64;
    let shipments = metric(port, "frugal_kv_shipments_total");
    let ship_s = metric(port, "frugal_kv_shipping_seconds_total") / shipments.max(1.0);
    // SIGTERM: the server answers what it admitted and exits.
    // SAFETY: `kill` on our own child's pid.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let _ = server.wait();
    let answered: Vec<&Seen> = seen
        .iter()
        .flatten()
        .filter(|s| s.error.is_none())
        .collect();
    if let Some(e) = seen.iter().flatten().find_map(|s| s.error.as_ref()) {
        bail!("a request failed: {e}");
    }
    if answered.len() < requests.len() {
        bail!(
            "{} of {} requests answered within --timeout {} s: raise it or send fewer --requests",
            answered.len(),
            requests.len(),
            a.timeout
        );
    }
    let pieces: usize = answered.iter().map(|s| s.pieces).sum();
    let tokens: usize = requests.iter().map(|r| r.max_new).sum();
    let ttft: Vec<f64> = answered.iter().map(|s| s.first_s).collect();
    let tpot: Vec<f64> = answered
        .iter()
        .zip(&requests)
        .filter(|(_, r)| r.max_new > 1)
        .map(|(s, r)| (s.last_s - s.first_s) / (r.max_new - 1) as f64)
        .collect();
    let q = |v: &[f64], p: f64| if v.is_empty() { 0.0 } else { percentile(v, p) };
    let mean =
        |f: fn(&(f64, f64)) -> f64| waste.iter().map(f).sum::<f64>() / waste.len().max(1) as f64;
    let (kv_waste, contiguous_waste) = (mean(|w| w.0), mean(|w| w.1));
    let tps = tokens as f64 / seconds;
    if a.json {
        println!(
            "{}",
            json!({
                "model": a.model, "requests": requests.len(), "max_seqs": a.max_seqs,
                "seconds": seconds, "generated_tokens": tokens, "text_pieces": pieces,
                "throughput_tokens_per_s": tps,
                "ttft_p50_s": q(&ttft, 0.5), "ttft_p99_s": q(&ttft, 0.99),
                "tpot_p50_s": q(&tpot, 0.5), "tpot_p99_s": q(&tpot, 0.99),
                "kv_waste_fraction": kv_waste, "contiguous_waste_fraction": contiguous_waste,
                "kv_waste_samples": waste.len(),
                "tp": a.tp, "prefill_ranks": a.prefill_ranks, "decode_ranks": a.decode_ranks,
                "kv_shipped_bytes": shipped,
                "kv_shipping_mean_s": ship_s,
                "cpu": cpu_name(),
            })
        );
    } else {
        println!(
            "{} over HTTP · {} requests at once · up to {} decoded together · {}",
            a.model,
            requests.len(),
            a.max_seqs,
            cpu_name()
        );
        println!(
            "{tokens} tokens in {seconds:.1} s: {tps:.1} tokens/s; time to first token p50 {:.2} s, p99 {:.2} s; per output token p50 {:.1} ms, p99 {:.1} ms",
            q(&ttft, 0.5),
            q(&ttft, 0.99),
            1e3 * q(&tpot, 0.5),
            1e3 * q(&tpot, 0.99)
        );
        println!(
            "KV cache: {:.1}% of the used blocks' slots empty, against {:.1}% of contiguous \
             caches of the whole context (mean of {} samples of /metrics)",
            100.0 * kv_waste,
            100.0 * contiguous_waste,
            waste.len()
        );
        if a.prefill_ranks > 0 {
            println!(
                "disaggregated: {} prefill ranks shipped {shipped} bytes of KV to {} decode \
                 workers, {:.1} ms a prompt from its prefill's end to its import",
                a.prefill_ranks,
                a.decode_ranks,
                1e3 * ship_s
            );
        }
    }
    Ok(())
}
