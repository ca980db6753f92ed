//! Prefill/decode disaggregation for `frugal serve --prefill-ranks P [--decode-ranks D]`: P
//! prefill workers, each a rank with a worker of its own (a long prompt chunk's activations, a KV
//! pool for one prompt), run admitted prompts, sample the first token and ship the prompt's KV to
//! the decode rank that admitted it (ranks 0..D, each an engine thread) with `comm`'s
//! point-to-point send; the decode worker imports it and only ever decodes, so a long prompt does
//! not stall the tokens of running requests (DistServe; vLLM's disaggregated prefill). Each role
//! has its own plan, measured exactly (the KV in transit, a prompt's per worker and per arrival,
//! is host memory outside both), and runs on its own cores (`--prefill-threads`), so both modes
//! use the machine's cores.
//!
//! Example: `frugal serve --model M --prefill-ranks 1 --prefill-threads 1` on a 2-core machine.

use super::engine::Job;
use comm::Collective;
use infer::sample::pick;
use infer::Worker;
use std::sync::{mpsc, Arc, Mutex};

/// A job sent to the prefill workers, with the KV blocks the engine reserved for it and the
/// decode rank (engine) its KV and its answer go to.
pub struct PrefillJob {
    pub job: Job,
    pub blocks: usize,
    pub to: usize,
}

/// Where the prefill workers answer each engine, by rank. Only the workers hold these, so an
/// engine's `done` reports it when every worker has gone.
pub type Replies = Arc<Vec<mpsc::Sender<Prefilled>>>;

/// A prefill worker's answer: the job, its first token and the sampler's state after it, and
/// where its KV waits (`from`'s next message), or why the prefill failed.
pub struct Prefilled {
    pub job: Job,
    pub blocks: usize,
    pub outcome: Result<Shipped, String>,
}

pub struct Shipped {
    pub first: u32,
    pub rng: data::SplitMix64,
    pub tokens: usize,
    pub from: usize,
    pub bytes: usize,
    /// The KV already received (MPI processes: a proxy thread took it off the wire); `None`:
    /// `from`'s next message on the engine's endpoint.
    pub kv: Option<Vec<u8>>,
    /// When the prefill ended (shipping time counts from here).
    pub prefilled_at: std::time::Instant,
}

/// The engine's side of disaggregation: the queue to the prefill workers, their answers, and
/// the decode rank's endpoint.
pub struct Disaggregated {
    pub jobs: mpsc::Sender<PrefillJob>,
    pub done: mpsc::Receiver<Prefilled>,
    /// This engine's rank: where its jobs' KV goes.
    pub rank: usize,
    /// The decode rank's endpoint, where the KV arrives (threads); `None` when it comes with
    /// the answer.
    pub comm: Option<Box<dyn Collective>>,
    /// Jobs sent and not yet imported, and their reserved blocks.
    pub in_flight: usize,
    pub in_flight_blocks: usize,
}

impl Disaggregated {
    /// Starts one prefill worker per endpoint of `comms` past the first `decode` (the decode
    /// engines' endpoints, ranks 0..decode), each built by `build` on its own thread inside
    /// `pool`; every decode engine's side, in rank order. The first error if any worker fails
    /// to start.
    pub fn start(
        mut comms: Vec<Box<dyn Collective>>,
        decode: usize,
        build: Arc<dyn Fn() -> anyhow::Result<Worker> + Send + Sync>,
        pool: Arc<rayon::ThreadPool>,
    ) -> anyhow::Result<Vec<Disaggregated>> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<PrefillJob>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let (replies, mut done): (Vec<_>, Vec<_>) = (0..decode).map(|_| mpsc::channel()).unzip();
        let replies: Replies = Arc::new(replies);
        let rest = comms.split_off(decode);
        let mut ready = Vec::new();
        for comm in rest {
            let (ok_tx, ok_rx) = mpsc::channel();
            let (build, pool, jobs) = (build.clone(), pool.clone(), jobs_rx.clone());
            let replies = replies.clone();
            // The loop runs on a thread of its own and enters the pool for each prompt only, so
            // a worker waiting for work holds none of the pool's threads.
            std::thread::Builder::new()
                .name(format!("prefill rank {}", comm.rank()))
                .spawn(move || match pool.install(|| build()) {
                    Ok(w) => {
                        let _ = ok_tx.send(Ok(()));
                        serve_prefills(w, comm, &jobs, &replies, &pool);
                    }
                    Err(e) => {
                        let _ = ok_tx.send(Err(e));
                    }
                })?;
            ready.push(ok_rx);
        }
        for r in ready {
            r.recv()
                .map_err(|_| anyhow::anyhow!("a prefill worker stopped while starting"))??;
        }
        drop(replies);
        let engines = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| Disaggregated {
                jobs: jobs_tx.clone(),
                done: done.remove(0),
                rank,
                comm: Some(comm),
                in_flight: 0,
                in_flight_blocks: 0,
            });
        Ok(engines.collect())
    }

    /// `job`, its `blocks` reserved, for the prefill workers; back when they have stopped.
    pub fn send(&mut self, job: Job, blocks: usize) -> Result<(), Box<Job>> {
        let to = self.rank;
        match self.jobs.send(PrefillJob { job, blocks, to }) {
            Ok(()) => {
                (self.in_flight, self.in_flight_blocks) =
                    (self.in_flight + 1, self.in_flight_blocks + blocks);
                Ok(())
            }
            Err(e) => Err(Box::new(e.0.job)),
        }
    }

    /// The KV of `s` from its prefill worker, imported into `worker` as a new sequence.
    pub fn receive(
        &mut self,
        worker: &mut infer::group::Group,
        s: &Shipped,
        buf: &mut Vec<u8>,
    ) -> Result<infer::blocks::SeqId, String> {
        let bytes = match (&s.kv, &mut self.comm) {
            (Some(kv), _) => kv,
            (None, Some(comm)) => {
                buf.resize(s.bytes, 0);
                comm.recv_bytes(buf, s.from).map_err(|e| {
                    format!(
                        "receiving the prompt's KV from prefill rank {}: {e}",
                        s.from
                    )
                })?;
                &*buf
            }
            (None, None) => return Err("the prompt's KV never arrived".into()),
        };
        worker.import_kv(s.tokens, bytes).map_err(|e| e.to_string())
    }
}

/// A prefill worker's loop: prefill, sample the first token, ship the KV to the job's decode
/// rank, free the sequence. Every job gets an answer, a panic inside one included (its error),
/// so the engine's count of jobs in flight stays true.
fn serve_prefills(
    mut worker: Worker,
    mut comm: Box<dyn Collective>,
    jobs: &Mutex<mpsc::Receiver<PrefillJob>>,
    replies: &Replies,
    pool: &rayon::ThreadPool,
) {
    let (mut logits, mut bytes) = (Vec::new(), Vec::new());
    loop {
        let next = jobs.lock().ok().and_then(|j| j.recv().ok());
        let Some(PrefillJob { job, blocks, to }) = next else {
            return;
        };
        let run = std::panic::AssertUnwindSafe(|| {
            let io = (&mut logits, &mut bytes);
            pool.install(|| prefill_one(&mut worker, &mut *comm, &job, to, io))
        });
        let outcome = std::panic::catch_unwind(run)
            .unwrap_or_else(|_| Err("the prefill worker failed on this prompt".into()));
        // An engine that has stopped takes no answer; the others still do.
        let _ = replies[to].send(Prefilled {
            job,
            blocks,
            outcome,
        });
    }
}

/// One prompt: its prefill, first token and KV shipped to decode rank `to`; the sequence freed.
fn prefill_one(
    worker: &mut Worker,
    comm: &mut dyn Collective,
    job: &Job,
    to: usize,
    (logits, bytes): (&mut Vec<f32>, &mut Vec<u8>),
) -> Result<Shipped, String> {
    let (first, rng) = prefill_export(worker, &job.prompt, &job.sampling, job.seed, logits, bytes)?;
    let prefilled_at = std::time::Instant::now();
    match comm.send_bytes(bytes, to) {
        Ok(()) => Ok(Shipped {
            first,
            rng,
            tokens: job.prompt.len(),
            from: comm.rank(),
            bytes: bytes.len(),
            kv: None,
            prefilled_at,
        }),
        Err(e) => Err(format!("shipping the prompt's KV: {e}")),
    }
}

/// A prefill worker's part of one prompt, wherever the worker runs: the prompt prefilled in a
/// new sequence, its first token sampled (the sampler seeded with `seed`), its KV exported into
/// `bytes` and the sequence freed; the first token and the sampler's state after it. The
/// shipping time counts from here.
pub fn prefill_export(
    worker: &mut Worker,
    prompt: &[u32],
    sampling: &infer::sample::Sampling,
    seed: u64,
    logits: &mut Vec<f32>,
    bytes: &mut Vec<u8>,
) -> Result<(u32, data::SplitMix64), String> {
    let seq = worker.new_sequence();
    // A panic inside is this prompt's error: the sequence is freed either way, so the worker's
    // one-prompt pool serves the next.
    let run = std::panic::AssertUnwindSafe(|| {
        worker.prefill(seq, prompt, logits).map(|()| {
            let mut rng = data::SplitMix64::new(seed);
            let first = pick(logits, sampling, &mut rng);
            bytes.clear();
            worker.export_kv(seq, bytes);
            (first, rng)
        })
    });
    let outcome = std::panic::catch_unwind(run);
    worker.free(seq);
    match outcome {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err("the prefill worker failed on this prompt".into()),
    }
}
