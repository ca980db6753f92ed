//! `GET /metrics` of `frugal serve`, in Prometheus' text format (as vLLM and llama-server expose
//! theirs): running and waiting requests, KV blocks used and free (summed over the decode
//! workers), time-to-first-token and inter-token latency histograms, generated tokens and the
//! recent tokens/s, and each decode worker's admitted requests. The engine threads write, the
//! HTTP tasks read. Example: `curl localhost:8000/metrics`.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const TTFT_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const ITL_BUCKETS: [f64; 10] = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5];
/// The window the recent tokens/s is measured over, in seconds.
const RATE_WINDOW_S: f64 = 10.0;

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, buckets: &[f64], x: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; buckets.len()];
        }
        for (c, b) in self.counts.iter_mut().zip(buckets) {
            if x <= *b {
                *c += 1;
            }
        }
        self.sum += x;
        self.n += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, buckets: &[f64]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in buckets.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.n);
    }
}

/// One decode worker's load.
#[derive(Clone, Copy, Default)]
struct Load {
    running: usize,
    kv_used: usize,
    kv_total: usize,
    /// Tokens the used blocks hold.
    kv_tokens: usize,
    /// Requests this worker admitted.
    admitted: u64,
}

#[derive(Default)]
struct Inner {
    /// Each decode worker's (engine's) load; the gauges are their sums.
    loads: Vec<Load>,
    /// A block's tokens.
    kv_block: usize,
    ttft: Histogram,
    itl: Histogram,
    tokens: u64,
    recent: VecDeque<Instant>,
    finished: [u64; 4],
    /// Prefill/decode disaggregation: KV bytes shipped and the shipments.
    shipped_bytes: u64,
    shipments: u64,
    shipping_s: f64,
}

/// How a request ended, for `frugal_requests_total`.
#[derive(Clone, Copy)]
pub enum Finish {
    Stop = 0,
    Length = 1,
    Cancelled = 2,
    Error = 3,
}

const FINISH_NAMES: [&str; 4] = ["stop", "length", "cancelled", "error"];

/// The server's counters, shared by the engine thread and the HTTP tasks.
#[derive(Default)]
pub struct Metrics {
    waiting: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Inner {
    fn load(&mut self, engine: usize) -> &mut Load {
        if self.loads.len() <= engine {
            self.loads.resize(engine + 1, Load::default());
        }
        &mut self.loads[engine]
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        if let Ok(mut g) = self.inner.lock() {
            f(&mut g);
        }
    }

    /// A request entered the queue.
    pub fn queued(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A request left the queue (admitted or refused).
    pub fn dequeued(&self) {
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| w.checked_sub(1));
    }

    /// Tokens per KV block (set once).
    pub fn set_block(&self, tokens: usize) {
        self.with(|m| m.kv_block = tokens);
    }

    /// Decode worker `engine`'s running requests and KV blocks (used, and the tokens they hold)
    /// of its pool of `kv_total`.
    pub fn set_load(
        &self,
        engine: usize,
        running: usize,
        (kv_used, kv_tokens): (usize, usize),
        kv_total: usize,
    ) {
        self.with(|m| {
            let l = m.load(engine);
            (l.running, l.kv_used, l.kv_tokens, l.kv_total) =
                (running, kv_used, kv_tokens, kv_total)
        });
    }

    /// Decode worker `engine` admitted a request.
    pub fn admitted(&self, engine: usize) {
        self.with(|m| m.load(engine).admitted += 1);
    }

    pub fn first_token(&self, seconds: f64) {
        self.with(|m| m.ttft.observe(&TTFT_BUCKETS, seconds));
    }

    pub fn inter_token(&self, seconds: f64) {
        self.with(|m| m.itl.observe(&ITL_BUCKETS, seconds));
    }

    pub fn token(&self) {
        self.with(|m| {
            m.tokens += 1;
            let now = Instant::now();
            m.recent.push_back(now);
            while m
                .recent
                .front()
                .is_some_and(|t| now.duration_since(*t).as_secs_f64() > RATE_WINDOW_S)
            {
                m.recent.pop_front();
            }
        });
    }

    /// A prompt's KV arrived from a prefill worker, `seconds` after its prefill ended.
    pub fn shipped(&self, bytes: u64, seconds: f64) {
        self.with(|m| {
            m.shipped_bytes += bytes;
            m.shipments += 1;
            m.shipping_s += seconds;
        });
    }

    pub fn finished(&self, how: Finish) {
        self.with(|m| m.finished[how as usize] += 1);
    }

    /// The Prometheus text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let waiting = self.waiting.load(Ordering::Relaxed);
        let Ok(m) = self.inner.lock() else {
            return out;
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let sum = |f: fn(&Load) -> usize| m.loads.iter().map(f).sum::<usize>() as f64;
        gauge(
            &mut out,
            "frugal_requests_running",
            "Requests in the running batch.",
            sum(|l| l.running),
        );
        gauge(
            &mut out,
            "frugal_requests_waiting",
            "Requests queued for admission.",
            waiting as f64,
        );
        gauge(
            &mut out,
            "frugal_kv_blocks_used",
            "KV-cache blocks held by running requests.",
            sum(|l| l.kv_used),
        );
        gauge(
            &mut out,
            "frugal_kv_blocks_free",
            "KV-cache blocks free in the pool.",
            sum(|l| l.kv_total.saturating_sub(l.kv_used)),
        );
        gauge(
            &mut out,
            "frugal_kv_block_size_tokens",
            "Tokens one KV block holds.",
            m.kv_block as f64,
        );
        gauge(
            &mut out,
            "frugal_kv_tokens_cached",
            "Tokens the used KV blocks hold (the rest of their slots is paged waste).",
            sum(|l| l.kv_tokens),
        );
        let rate = match (m.recent.front(), m.recent.back()) {
            (Some(a), Some(b))
                if m.recent.len() > 1 && Instant::now().duration_since(*b).as_secs_f64() < 1.0 =>
            {
                (m.recent.len() - 1) as f64 / b.duration_since(*a).as_secs_f64().max(1e-9)
            }
            _ => 0.0,
        };
        gauge(
            &mut out,
            "frugal_generation_tokens_per_second",
            "Generated tokens per second over the last 10 s (0 when idle).",
            rate,
        );
        let _ = writeln!(
            out,
            "# HELP frugal_generated_tokens_total Tokens generated.\n\
             # TYPE frugal_generated_tokens_total counter\nfrugal_generated_tokens_total {}",
            m.tokens
        );
        let _ = writeln!(
            out,
            "# HELP frugal_kv_shipped_bytes_total KV bytes shipped from prefill to decode workers.\n\
             # TYPE frugal_kv_shipped_bytes_total counter\nfrugal_kv_shipped_bytes_total {}\n\
             # HELP frugal_kv_shipments_total Prompts whose KV was shipped.\n\
             # TYPE frugal_kv_shipments_total counter\nfrugal_kv_shipments_total {}\n\
             # HELP frugal_kv_shipping_seconds_total From the end of a prompt's prefill to its KV \
             imported by the decode worker, summed.\n\
             # TYPE frugal_kv_shipping_seconds_total counter\nfrugal_kv_shipping_seconds_total {}",
            m.shipped_bytes, m.shipments, m.shipping_s
        );
        let _ = writeln!(
            out,
            "# HELP frugal_requests_total Requests finished, by how.\n# TYPE frugal_requests_total counter"
        );
        for (name, n) in FINISH_NAMES.iter().zip(m.finished) {
            let _ = writeln!(out, "frugal_requests_total{{finish=\"{name}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP frugal_engine_requests_admitted_total Requests each decode worker admitted.\n\
             # TYPE frugal_engine_requests_admitted_total counter"
        );
        for (i, l) in m.loads.iter().enumerate() {
            let _ = writeln!(
                out,
                "frugal_engine_requests_admitted_total{{engine=\"{i}\"}} {}",
                l.admitted
            );
        }
        m.ttft.render(
            &mut out,
            "frugal_time_to_first_token_seconds",
            "From arrival to the first token.",
            &TTFT_BUCKETS,
        );
        m.itl.render(
            &mut out,
            "frugal_inter_token_latency_seconds",
            "Between a request's consecutive tokens.",
            &ITL_BUCKETS,
        );
        out
    }
}
