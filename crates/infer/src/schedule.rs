//! Continuous batching (Orca's iteration-level scheduling, vLLM's block-budget admission): every
//! step, finished sequences leave, waiting requests join while the decode batch and the KV pool
//! have room for their prompt, and the running sequences decode one token each. A sequence that
//! cannot get a block for its next token preempts the most recently admitted one, whose blocks
//! are freed and which waits again with the tokens it generated (vLLM's recompute preemption), so
//! the pool is never exceeded and nothing runs out of memory.
//!
//! The policy is [`Schedule`], which only counts blocks; [`run`] drives it with a worker, and
//! [`simulate`] replays it on the trace's lengths alone, through the same block manager, which is the plan's prediction of the
//! run's concurrency, waste and preemptions (the same rule over the same lengths: a trace whose
//! requests all arrive at once, as vLLM's throughput benchmark, is deterministic).
//!
//! Example: `let report = schedule::run(&mut worker, &requests, &Sampling::greedy(), 1)?;`

use super::blocks::SeqId;
use super::executor::{Executor, Replay, Single};
use super::sample::Sampling;
use super::Worker;
use engine::backend::InferOps;
use engine::error::EngineError;
use plan_frugal::ServeSetup;
use std::time::Instant;

/// One request: a prompt and how many tokens to generate (end-of-text is not a stop: the
/// benchmark's lengths are the trace's).
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new: usize,
}

/// What a run (or its simulation) did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ScheduleStats {
    pub decode_steps: u64,
    pub admissions: u64,
    pub max_concurrent: usize,
    pub preemptions: u64,
    /// Σ over decode steps of KV slots allocated (blocks × block tokens) and of tokens cached.
    pub allocated_slots: u64,
    pub used_slots: u64,
    /// The same for a contiguous cache that reserves the whole context per running sequence.
    pub contiguous_slots: u64,
    pub generated_tokens: u64,
    /// The most KV blocks held at once, and what the same sequences would hold without sharing
    /// the common prompt's blocks.
    pub peak_blocks: usize,
    pub peak_blocks_unshared: usize,
}

impl ScheduleStats {
    /// Allocated but unused KV over allocated, averaged over decode steps (0 with none).
    pub fn kv_waste_fraction(&self) -> f64 {
        waste(self.used_slots, self.allocated_slots)
    }

    pub fn contiguous_waste_fraction(&self) -> f64 {
        waste(self.used_slots, self.contiguous_slots)
    }
}

fn waste(used: u64, allocated: u64) -> f64 {
    if allocated == 0 {
        0.0
    } else {
        1.0 - used as f64 / allocated as f64
    }
}

/// A run's report: the stats and each request's latency.
#[derive(Clone, Debug, Default)]
pub struct ServeReport {
    pub stats: ScheduleStats,
    /// Seconds from the start (every request arrives at once) to each request's last token.
    pub latencies_s: Vec<f64>,
    /// Seconds to each request's first token.
    pub first_token_s: Vec<f64>,
    pub seconds: f64,
    pub outputs: Vec<Vec<u32>>,
}

/// A request's progress.
#[derive(Clone, Debug)]
struct Live {
    request: usize,
    /// Tokens the sequence holds or will hold next (prompt + generated so far).
    tokens: Vec<u32>,
    generated: usize,
}

/// The block-counting policy shared by the run and its simulation.
struct Schedule {
    block: usize,
    max_seqs: usize,
    context: usize,
    waiting: std::collections::VecDeque<Live>,
}

impl Schedule {
    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block)
    }
}

#[allow(clippy::too_many_arguments)]
fn drive(
    exec: &mut dyn Executor,
    requests: &[Request],
    block: usize,
    max_seqs: usize,
    context: usize,
    prefix: usize,
    mut on_token: impl FnMut(usize, usize, u32),
) -> Result<ScheduleStats, EngineError> {
    let mut s = Schedule {
        block,
        max_seqs,
        context,
        waiting: requests
            .iter()
            .enumerate()
            .map(|(i, r)| Live {
                request: i,
                tokens: r.prompt.clone(),
                generated: 0,
            })
            .collect(),
    };
    for r in requests {
        if r.prompt.is_empty() || r.max_new == 0 {
            return Err(EngineError::Infer(
                "a request needs a prompt of at least one token and at least one new token".into(),
            ));
        }
        if r.prompt.len() + r.max_new > context {
            return Err(EngineError::Infer(format!(
                "a request of {} prompt + {} new tokens does not fit the context of {context}",
                r.prompt.len(),
                r.max_new
            )));
        }
        if s.blocks_for(r.prompt.len() + r.max_new) > exec.free_blocks() + exec.used_blocks() {
            return Err(EngineError::Infer(format!(
                "a request of {} tokens needs more KV blocks than the whole pool holds: raise \
                 --kv-budget",
                r.prompt.len() + r.max_new
            )));
        }
    }
    if prefix > 0 {
        let shared = &requests[0].prompt[..prefix.min(requests[0].prompt.len())];
        if requests
            .iter()
            .any(|r| r.prompt.len() <= prefix || r.prompt[..prefix] != *shared)
        {
            return Err(EngineError::Infer(format!(
                "every prompt must start with the same {prefix} tokens and go on past them"
            )));
        }
        if s.blocks_for(prefix) >= exec.free_blocks() {
            return Err(EngineError::Infer(
                "the shared prompt fills the KV pool: raise --kv-budget".into(),
            ));
        }
        exec.share(shared)?;
    }
    // Blocks every fork shares whole (the shared prompt's last, partial block is copied).
    let full_shared = if prefix > 0 { prefix / block } else { 0 };
    let mut stats = ScheduleStats::default();
    let mut running: Vec<(SeqId, Live)> = Vec::new();
    while !s.waiting.is_empty() || !running.is_empty() {
        // Join: FCFS while the batch and the pool (with a block of headroom) have room.
        while running.len() < s.max_seqs {
            let Some(next) = s.waiting.front() else { break };
            let need = s.blocks_for(next.tokens.len() + 1) - full_shared;
            if need > exec.free_blocks() {
                break;
            }
            let mut live = s.waiting.pop_front().expect("a waiting request");
            let (seq, first) = exec.admit(&live.tokens)?;
            stats.admissions += 1;
            on_token(live.request, live.generated, first);
            live.tokens.push(first);
            live.generated += 1;
            stats.generated_tokens += 1;
            running.push((seq, live));
        }
        // Leave: finished sequences free their blocks.
        let mut i = 0;
        while i < running.len() {
            if running[i].1.generated >= requests[running[i].1.request].max_new {
                let (seq, _) = running.remove(i);
                exec.release(seq);
            } else {
                i += 1;
            }
        }
        if running.is_empty() {
            if s.waiting.is_empty() {
                break;
            }
            continue;
        }
        // Room for one token each, preempting the newest until it fits.
        loop {
            let need: usize = running
                .iter()
                .map(|(seq, _)| exec.blocks_needed(*seq))
                .sum();
            if need <= exec.free_blocks() {
                break;
            }
            if running.len() == 1 {
                return Err(EngineError::Infer(
                    "one sequence alone needs more KV blocks than the pool holds beside the \
                     shared prompt: raise --kv-budget"
                        .into(),
                ));
            }
            let (seq, mut live) = running.pop().expect("a running sequence");
            exec.release(seq);
            // Recompute preemption: the generated tokens join the prompt; the last one is fed
            // again by the re-admission's prefill.
            live.tokens.pop();
            live.generated -= 1;
            stats.generated_tokens -= 1;
            s.waiting.push_front(live);
            stats.preemptions += 1;
        }
        stats.max_concurrent = stats.max_concurrent.max(running.len());
        let seqs: Vec<SeqId> = running.iter().map(|(q, _)| *q).collect();
        let feed: Vec<u32> = running
            .iter()
            .map(|(_, l)| *l.tokens.last().expect("a token"))
            .collect();
        let next = exec.decode(&seqs, &feed)?;
        stats.decode_steps += 1;
        // Tokens held in distinct slots: the shared prompt's whole blocks count once.
        let own = |l: &Live| l.tokens.len() - full_shared * s.block;
        let used: usize = running.iter().map(|(_, l)| own(l)).sum::<usize>()
            + full_shared * s.block * usize::from(prefix > 0);
        stats.used_slots += used as u64;
        stats.peak_blocks = stats.peak_blocks.max(exec.used_blocks());
        let unshared: usize = running
            .iter()
            .map(|(_, l)| s.blocks_for(l.tokens.len()))
            .sum();
        stats.peak_blocks_unshared = stats.peak_blocks_unshared.max(unshared);
        stats.allocated_slots += (exec.used_blocks() * s.block) as u64;
        stats.contiguous_slots += (running.len() * s.context) as u64;
        for ((_, live), t) in running.iter_mut().zip(next) {
            on_token(live.request, live.generated, t);
            live.tokens.push(t);
            live.generated += 1;
            stats.generated_tokens += 1;
        }
    }
    exec.unshare();
    Ok(stats)
}

/// Serves `requests` (all arriving at once) on `worker`, sampling with `sampling`; the first
/// `prefix` tokens, common to every prompt, are cached once and shared (0: none).
pub fn run<B: InferOps>(
    worker: &mut Worker<B>,
    requests: &[Request],
    prefix: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<ServeReport, EngineError> {
    let (block, max_seqs, context) = (
        worker.setup.kv_block as usize,
        worker.setup.max_seqs as usize,
        worker.setup.context as usize,
    );
    let t0 = Instant::now();
    let mut outputs = vec![Vec::new(); requests.len()];
    let mut first = vec![0.0; requests.len()];
    let mut last = vec![0.0; requests.len()];
    let mut exec = Single::new(worker, *sampling, seed);
    let stats = drive(
        &mut exec,
        requests,
        block,
        max_seqs,
        context,
        prefix,
        |r, i, t| {
            let now = t0.elapsed().as_secs_f64();
            if i == 0 {
                first[r] = now;
            }
            outputs[r].truncate(i);
            outputs[r].push(t);
            last[r] = now;
        },
    )?;
    Ok(ServeReport {
        stats,
        latencies_s: last,
        first_token_s: first,
        seconds: t0.elapsed().as_secs_f64(),
        outputs,
    })
}

/// The schedule of `requests` on the KV pool `setup` plans, by the worker's block rule alone:
/// the plan's prediction of a run's concurrency, waste and preemptions. `window` is the model's
/// sliding window when every layer has one (`window_everywhere`); `prefix` as in [`run`].
pub fn simulate(
    requests: &[Request],
    setup: &ServeSetup,
    window: Option<usize>,
    prefix: usize,
) -> Result<ScheduleStats, EngineError> {
    let block = setup.kv_block as usize;
    let mut exec = Replay::new(
        setup.kv_blocks as usize,
        block,
        setup.prefill_chunk as usize,
        window,
    );
    drive(
        &mut exec,
        requests,
        block,
        setup.max_seqs as usize,
        setup.context as usize,
        prefix,
        |_, _, _| {},
    )
}
