//! The engine thread of `frugal serve`: one worker (weights, paged KV cache, prefill and decode
//! steps) owned by a thread of its own, fed jobs through a bounded queue, answering each with a
//! stream of events. Continuous batching, as vLLM schedules: between decode steps waiting jobs
//! are admitted while a sequence slot is free and the KV pool can hold their prompt and
//! `max_tokens` (admission reserves the worst case, so a running job is never preempted), each
//! admitted job is prefilled, and one decode step then advances every running job by a token.
//! A job whose client has gone is dropped at its next token and its KV blocks freed.
//!
//! Several engines (`--decode-ranks D`, each its own worker and KV pool, as vLLM's data-parallel
//! engines) share one queue ([`Queue`]): an idle engine takes the next job, a busy one takes
//! work only while no engine is idle, and a job one engine cannot hold waits for any with room.

use super::logprobs::{self, TokenLogprob};
use super::metrics::{Finish, Metrics};
use super::pd::{Disaggregated, Prefilled};
use super::queue::Queue;
use infer::blocks::SeqId;
use infer::group::Group;
use infer::sample::Sampling;
use infer::Worker;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// What a request asks for, tokenized.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Text that ends the answer where it first appears (not included).
    pub stop: Vec<String>,
    /// Generate past the end-of-sequence token (exactly `max_tokens`).
    pub ignore_eos: bool,
    /// Each token's log-probability and this many likeliest alternatives (`None`: not asked).
    pub logprobs: Option<usize>,
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub queued_at: Instant,
}

/// What the engine sends back for a job.
#[derive(Debug)]
pub enum Event {
    /// New text (may be empty while a multi-byte character is incomplete).
    Text(String),
    /// A kept token's log-probability (with `Job::logprobs`), before its text.
    Token(TokenLogprob),
    Done {
        finish_reason: &'static str,
        completion_tokens: usize,
    },
    Failed(String),
}

/// A job with a sequence in the worker.
struct Running {
    job: Job,
    seq: SeqId,
    rng: data::SplitMix64,
    /// Tokens generated so far.
    ids: Vec<u32>,
    /// Text sent so far.
    sent: String,
    /// Characters in the decoded text of `ids` (where the next token's text starts).
    chars: usize,
    /// KV blocks reserved for the prompt and `max_tokens`.
    blocks: usize,
    /// A stop text ended it: what follows it is never sent.
    stopped_at_text: bool,
    last_token_at: Instant,
}

impl Running {
    /// `job` in sequence `seq`, sampling from `rng`, holding a reservation of `blocks`.
    fn new(job: Job, seq: SeqId, rng: data::SplitMix64, blocks: usize) -> Running {
        Running {
            job,
            seq,
            rng,
            ids: Vec::new(),
            sent: String::new(),
            chars: 0,
            blocks,
            stopped_at_text: false,
            last_token_at: Instant::now(),
        }
    }
}

/// How a token left a job.
enum Step {
    /// Still running: its last token feeds the next decode step.
    Next,
    /// Finished (`stop`, `length`) or its client went (`None`).
    Finished(Option<&'static str>),
}

/// Runs jobs from `jobs` on `worker` (decode worker `engine` for the metrics) until the queue
/// closes and every admitted job is done.
pub fn run(
    mut worker: Group,
    tok: data::Tokenizer,
    jobs: Queue,
    (metrics, engine): (Arc<Metrics>, usize),
    mut pd: Option<Disaggregated>,
) {
    let max_seqs = worker.setup.max_seqs as usize;
    let (block, pool) = (
        worker.setup.kv_block as usize,
        worker.setup.kv_blocks as usize,
    );
    metrics.set_block(block);
    metrics.set_load(engine, 0, (0, 0), pool);
    let mut running: Vec<Running> = Vec::new();
    let mut closed = false;
    let mut logits = Vec::new();
    let mut shipped = Vec::new();
    loop {
        // Admit while a slot and the blocks for the job's worst case are free.
        while running.len() + pd.as_ref().map_or(0, |d| d.in_flight) < max_seqs {
            let idle = running.is_empty() && pd.as_ref().is_none_or(|d| d.in_flight == 0);
            let need = |job: &Job| (job.prompt.len() + job.max_tokens).div_ceil(block);
            let reserved: usize = running.iter().map(|r| r.blocks).sum::<usize>()
                + pd.as_ref().map_or(0, |d| d.in_flight_blocks);
            let job = match idle {
                // Idle: wait until a job comes (or the queue closes with nothing parked).
                true => match jobs.wait() {
                    Some(j) => j,
                    None => return,
                },
                false => match jobs.poll(|j| reserved + need(j) <= pool) {
                    Ok(j) => j,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                },
            };
            if job.events.is_closed() {
                // The client left while its request waited: nothing to run.
                metrics.dequeued();
                metrics.finished(Finish::Cancelled);
                continue;
            }
            let need = need(&job);
            if need > pool {
                metrics.dequeued();
                metrics.finished(Finish::Error);
                let _ = job.events.send(Event::Failed(format!(
                    "the prompt and max_tokens need {need} KV blocks; the pool has {pool}: \
                     ask for fewer tokens"
                )));
                continue;
            }
            if reserved + need > pool {
                // Any engine with room takes it; this one waits for its running jobs.
                jobs.park(job);
                break;
            }
            metrics.dequeued();
            metrics.admitted(engine);
            if let Some(d) = &mut pd {
                // The prompt runs on a prefill worker; its KV arrives later.
                if let Err(job) = d.send(job, need) {
                    metrics.finished(Finish::Error);
                    let failed = Event::Failed("the prefill workers have stopped".into());
                    let _ = job.events.send(failed);
                }
                continue;
            }
            match admit(
                &mut worker,
                &tok,
                job,
                need,
                &mut logits,
                (&metrics, engine, running.len()),
            ) {
                Some(r) => running.push(r),
                None => continue,
            }
        }
        if let Some(d) = &mut pd {
            let at = (&*metrics, engine);
            arrivals(d, &mut worker, &tok, &mut running, at, &mut shipped);
        }
        if running.is_empty() {
            if closed && jobs.nothing_parked() && pd.as_ref().is_none_or(|d| d.in_flight == 0) {
                return;
            }
            continue;
        }
        metrics.set_load(engine, running.len(), kv_load(&worker, pool), pool);
        let seqs: Vec<SeqId> = running.iter().map(|r| r.seq).collect();
        let last: Vec<u32> = running
            .iter()
            .map(|r| *r.ids.last().unwrap_or(&0))
            .collect();
        if let Err(e) = worker.decode(&seqs, &last, &mut logits) {
            for r in running.drain(..) {
                metrics.finished(Finish::Error);
                let _ = r.job.events.send(Event::Failed(format!("{e}")));
                worker.free(r.seq);
            }
            continue;
        }
        let vocab = logits.len() / seqs.len();
        let mut i = 0;
        let mut row = 0;
        while i < running.len() {
            let r = &mut running[i];
            let step = advance(r, &tok, &logits[row * vocab..(row + 1) * vocab], &metrics);
            row += 1;
            match step {
                Step::Next => i += 1,
                Step::Finished(reason) => {
                    let r = running.remove(i);
                    finish(
                        &mut worker,
                        r,
                        &tok,
                        reason,
                        (&metrics, engine, running.len()),
                    );
                }
            }
        }
        metrics.set_load(engine, running.len(), kv_load(&worker, pool), pool);
    }
}

/// KV blocks in use and the tokens they hold.
fn kv_load(worker: &Worker, pool: usize) -> (usize, usize) {
    (
        pool.saturating_sub(worker.free_blocks()),
        worker.blocks.held_tokens(),
    )
}

/// Prompts the prefill workers finished: their KV received and imported, their first token
/// streamed, the job joining the batch. Waits a little for one when nothing else runs.
fn arrivals(
    d: &mut Disaggregated,
    worker: &mut Group,
    tok: &data::Tokenizer,
    running: &mut Vec<Running>,
    (metrics, engine): (&Metrics, usize),
    buf: &mut Vec<u8>,
) {
    loop {
        let got = match running.is_empty() && d.in_flight > 0 {
            true => d
                .done
                .recv_timeout(std::time::Duration::from_millis(5))
                .map_err(|e| e == mpsc::RecvTimeoutError::Disconnected),
            false => d
                .done
                .try_recv()
                .map_err(|e| e == mpsc::TryRecvError::Disconnected),
        };
        let Prefilled {
            job,
            blocks,
            outcome,
        } = match got {
            Ok(p) => p,
            // Every prefill worker has gone: nothing in flight will come back (its clients'
            // streams have closed), and new jobs are refused when sent.
            Err(true) => {
                (d.in_flight, d.in_flight_blocks) = (0, 0);
                return;
            }
            Err(false) => return,
        };
        (d.in_flight, d.in_flight_blocks) = (d.in_flight - 1, d.in_flight_blocks - blocks);
        let imported = outcome.and_then(|s| d.receive(worker, &s, buf).map(|seq| (seq, s)));
        let (seq, s) = match imported {
            Ok(x) => x,
            Err(e) => {
                metrics.finished(Finish::Error);
                let _ = job.events.send(Event::Failed(e));
                continue;
            }
        };
        metrics.shipped(s.bytes as u64, s.prefilled_at.elapsed().as_secs_f64());
        metrics.first_token(job.queued_at.elapsed().as_secs_f64());
        let mut r = Running::new(job, seq, s.rng, blocks);
        // A prefill worker's first token comes without its logits (the server refuses logprobs
        // when disaggregated).
        match accept(&mut r, tok, s.first, None, metrics) {
            Step::Next => running.push(r),
            Step::Finished(reason) => {
                let still = running.len();
                finish(worker, r, tok, reason, (metrics, engine, still));
            }
        }
    }
}

/// Prefills `job` and samples its first token; `None` when it already finished.
fn admit(
    worker: &mut Group,
    tok: &data::Tokenizer,
    job: Job,
    blocks: usize,
    logits: &mut Vec<f32>,
    (metrics, engine, running): (&Metrics, usize, usize),
) -> Option<Running> {
    let seq = worker.new_sequence();
    let rng = data::SplitMix64::new(job.seed);
    let mut r = Running::new(job, seq, rng, blocks);
    if let Err(e) = worker.prefill(seq, &r.job.prompt, logits) {
        metrics.finished(Finish::Error);
        let _ = r.job.events.send(Event::Failed(format!("{e}")));
        worker.free(seq);
        return None;
    }
    metrics.first_token(r.job.queued_at.elapsed().as_secs_f64());
    r.last_token_at = Instant::now();
    match advance(&mut r, tok, logits, metrics) {
        Step::Next => Some(r),
        Step::Finished(reason) => {
            finish(worker, r, tok, reason, (metrics, engine, running));
            None
        }
    }
}

/// Samples the next token of `r` from `logits` and streams its text.
fn advance(r: &mut Running, tok: &data::Tokenizer, logits: &[f32], metrics: &Metrics) -> Step {
    if !r.ids.is_empty() {
        metrics.inter_token(r.last_token_at.elapsed().as_secs_f64());
    }
    let t = infer::sample::pick(logits, &r.job.sampling, &mut r.rng);
    let lp = (r.job.logprobs).map(|top| {
        let limit = r.job.sampling.vocab_limit.unwrap_or(logits.len());
        // Where the token's text starts: the answer's characters before it.
        logprobs::of(logits, limit, t, top, r.chars)
    });
    accept(r, tok, t, lp, metrics)
}

/// Takes `t` as the next token of `r` and streams its log-probability (`lp`, when asked) and
/// its text.
fn accept(
    r: &mut Running,
    tok: &data::Tokenizer,
    t: u32,
    lp: Option<TokenLogprob>,
    metrics: &Metrics,
) -> Step {
    r.last_token_at = Instant::now();
    if Some(t) == tok.eos() && !r.job.ignore_eos {
        return Step::Finished(Some("stop"));
    }
    r.ids.push(t);
    if let Some(lp) = lp {
        if r.job.events.send(Event::Token(lp)).is_err() {
            return Step::Finished(None);
        }
    }
    metrics.token();
    let Ok(text) = tok.decode(&r.ids) else {
        return Step::Finished(Some("stop"));
    };
    r.chars = text.chars().count();
    // Hold back an incomplete character (U+FFFD at the end) until it completes.
    let settled = text.trim_end_matches('\u{FFFD}');
    let (piece, stopped) = match r
        .job
        .stop
        .iter()
        .filter_map(|s| text.find(s.as_str()))
        .min()
    {
        Some(at) => (
            text[..at].get(r.sent.len()..).unwrap_or("").to_string(),
            true,
        ),
        None => (settled.get(r.sent.len()..).unwrap_or("").to_string(), false),
    };
    if !piece.is_empty() {
        r.sent.push_str(&piece);
        if r.job.events.send(Event::Text(piece)).is_err() {
            return Step::Finished(None); // the client has gone: free its blocks now
        }
    }
    if stopped {
        r.stopped_at_text = true;
        return Step::Finished(Some("stop"));
    }
    if r.ids.len() >= r.job.max_tokens {
        return Step::Finished(Some("length"));
    }
    Step::Next
}

/// Sends what was held back and the job's end, and frees its blocks.
fn finish(
    worker: &mut Group,
    r: Running,
    tok: &data::Tokenizer,
    reason: Option<&'static str>,
    (metrics, engine, still_running): (&Metrics, usize, usize),
) {
    worker.free(r.seq);
    // Counted before the client hears the end, so it never reads the request as still running.
    let pool = worker.setup.kv_blocks as usize;
    metrics.set_load(engine, still_running, kv_load(worker, pool), pool);
    metrics.finished(match reason {
        Some("length") => Finish::Length,
        Some(_) => Finish::Stop,
        None => Finish::Cancelled,
    });
    let Some(finish_reason) = reason else {
        return;
    };
    // An incomplete character held back at the very end goes out as it is.
    if !r.stopped_at_text {
        if let Ok(text) = tok.decode(&r.ids) {
            if let Some(rest) = text.get(r.sent.len()..).filter(|x| !x.is_empty()) {
                let _ = r.job.events.send(Event::Text(rest.to_string()));
            }
        }
    }
    let _ = r.job.events.send(Event::Done {
        finish_reason,
        completion_tokens: r.ids.len(),
    });
}
