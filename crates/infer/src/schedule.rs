//! Continuous batching (Orca's iteration-level scheduling, vLLM's block-budget admission): every
//! step, finished sequences leave, waiting requests join while the decode batch and the KV pool
//! have room for their prompt, and the running sequences decode one token each. A sequence that
//! cannot get a block for its next token preempts the most recently admitted one, whose blocks
//! are freed and which waits again with the tokens it generated (vLLM's recompute preemption), so
//! the pool is never exceeded and nothing runs out of memory.
//!
//! The policy is [`Schedule`], which only counts blocks; [`run`] drives it with a server, and
//! [`simulate`] replays it on the trace's lengths alone, which is the plan's prediction of the
//! run's concurrency, waste and preemptions (the same rule over the same lengths: a trace whose
//! requests all arrive at once, as vLLM's throughput benchmark, is deterministic).
//!
//! Example: `let report = schedule::run(&mut server, &requests, &Sampling::greedy(), 1)?;`

use super::pool::SeqId;
use super::sample::{pick, Sampling};
use super::Server;
use data::SplitMix64;
use engine::backend::Backend;
use engine::error::EngineError;
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

/// What the scheduler asks of its executor: a server, or the simulation's block counter.
trait Exec {
    fn free_blocks(&self) -> usize;
    /// Caches the common prompt once; later admissions fork it.
    fn share(&mut self, prefix: &[u32]) -> Result<(), EngineError>;
    /// A new sequence of `tokens` (forking the shared prompt, when there is one, and running only
    /// the rest), and its first sampled token.
    fn admit(&mut self, tokens: &[u32]) -> Result<(SeqId, u32), EngineError>;
    fn decode(&mut self, seqs: &[SeqId], tokens: &[u32]) -> Result<Vec<u32>, EngineError>;
    fn blocks_needed(&self, seq: SeqId) -> usize;
    fn used_blocks(&self) -> usize;
    fn release(&mut self, seq: SeqId);
    /// Drops the shared prompt.
    fn unshare(&mut self);
}

#[allow(clippy::too_many_arguments)]
fn drive(
    exec: &mut dyn Exec,
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

struct Real<'a, B: Backend> {
    server: &'a mut Server<B>,
    sampling: Sampling,
    rng: SplitMix64,
    logits: Vec<f32>,
    /// The shared prompt's sequence and length.
    root: Option<(SeqId, usize)>,
}

impl<B: Backend> Exec for Real<'_, B> {
    fn free_blocks(&self) -> usize {
        self.server.free_blocks()
    }
    fn share(&mut self, prefix: &[u32]) -> Result<(), EngineError> {
        let root = self.server.new_sequence();
        self.server.prefill(root, prefix, &mut self.logits)?;
        self.root = Some((root, prefix.len()));
        Ok(())
    }
    fn admit(&mut self, tokens: &[u32]) -> Result<(SeqId, u32), EngineError> {
        let (seq, rest) = match self.root {
            Some((root, n)) => (self.server.fork(root), &tokens[n..]),
            None => (self.server.new_sequence(), tokens),
        };
        // The prompt's logits give the first token; the first decode feeds it.
        self.server.prefill(seq, rest, &mut self.logits)?;
        Ok((seq, pick(&self.logits, &self.sampling, &mut self.rng)))
    }
    fn unshare(&mut self) {
        if let Some((root, _)) = self.root.take() {
            self.server.free(root);
        }
    }
    fn decode(&mut self, seqs: &[SeqId], tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        self.server.decode(seqs, tokens, &mut self.logits)?;
        let v = self.server.config.shape.vocab as usize;
        Ok(self
            .logits
            .chunks_exact(v)
            .map(|row| pick(row, &self.sampling, &mut self.rng))
            .collect())
    }
    fn blocks_needed(&self, seq: SeqId) -> usize {
        self.server.blocks_needed(seq, 1)
    }
    fn used_blocks(&self) -> usize {
        self.server.pool.used()
    }
    fn release(&mut self, seq: SeqId) {
        self.server.free(seq)
    }
}

/// Serves `requests` (all arriving at once) on `server`, sampling with `sampling`; the first
/// `prefix` tokens, common to every prompt, are cached once and shared (0: none).
pub fn run<B: Backend>(
    server: &mut Server<B>,
    requests: &[Request],
    prefix: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<ServeReport, EngineError> {
    let (block, max_seqs, context) = (
        server.setup.kv_block as usize,
        server.setup.max_seqs as usize,
        server.setup.context as usize,
    );
    let t0 = Instant::now();
    let mut outputs = vec![Vec::new(); requests.len()];
    let mut first = vec![0.0; requests.len()];
    let mut last = vec![0.0; requests.len()];
    let mut exec = Real {
        server,
        sampling: *sampling,
        rng: SplitMix64::new(seed),
        logits: Vec::new(),
        root: None,
    };
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

struct Counted {
    pool: super::pool::BlockPool,
    seqs: Vec<Option<(Vec<u32>, usize)>>,
    block: usize,
    root: Option<(SeqId, usize)>,
}

impl Counted {
    /// The server's growth rule: a block at each boundary, a copy of a shared partial block.
    fn grow(&mut self, seq: SeqId, n: usize) {
        let (blocks, len) = self.seqs[seq.0].as_mut().expect("a live sequence");
        for p in *len..*len + n {
            if p % self.block == 0 {
                blocks.push(self.pool.alloc().expect("room checked"));
            } else {
                let last = blocks.len() - 1;
                if self.pool.is_shared(blocks[last]) {
                    let new = self.pool.alloc().expect("room checked");
                    self.pool.release(blocks[last]);
                    blocks[last] = new;
                }
            }
        }
        *len += n;
    }

    fn new_seq(&mut self) -> SeqId {
        self.seqs.push(Some((Vec::new(), 0)));
        SeqId(self.seqs.len() - 1)
    }
}

impl Exec for Counted {
    fn free_blocks(&self) -> usize {
        self.pool.free_count()
    }
    fn share(&mut self, prefix: &[u32]) -> Result<(), EngineError> {
        let root = self.new_seq();
        self.grow(root, prefix.len());
        self.root = Some((root, prefix.len()));
        Ok(())
    }
    fn admit(&mut self, tokens: &[u32]) -> Result<(SeqId, u32), EngineError> {
        let (seq, rest) = match self.root {
            Some((root, n)) => {
                let shared = self.seqs[root.0].clone().expect("the shared prompt");
                shared.0.iter().for_each(|&b| self.pool.retain(b));
                self.seqs.push(Some(shared));
                (SeqId(self.seqs.len() - 1), tokens.len() - n)
            }
            None => (self.new_seq(), tokens.len()),
        };
        self.grow(seq, rest);
        Ok((seq, 0))
    }
    fn decode(&mut self, seqs: &[SeqId], _tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        for &s in seqs {
            self.grow(s, 1);
        }
        Ok(vec![0; seqs.len()])
    }
    fn blocks_needed(&self, seq: SeqId) -> usize {
        let (blocks, len) = self.seqs[seq.0].as_ref().expect("a live sequence");
        let cow = *len % self.block != 0 && self.pool.is_shared(*blocks.last().expect("a block"));
        usize::from(*len % self.block == 0 || cow)
    }
    fn used_blocks(&self) -> usize {
        self.pool.used()
    }
    fn release(&mut self, seq: SeqId) {
        if let Some((blocks, _)) = self.seqs[seq.0].take() {
            blocks.into_iter().for_each(|b| self.pool.release(b));
        }
    }
    fn unshare(&mut self) {
        if let Some((root, _)) = self.root.take() {
            self.release(root);
        }
    }
}

/// The schedule of `requests` on a pool of `kv_blocks` blocks, by counting blocks alone.
pub fn simulate(
    requests: &[Request],
    kv_blocks: usize,
    block: usize,
    max_seqs: usize,
    context: usize,
    prefix: usize,
) -> Result<ScheduleStats, EngineError> {
    let mut exec = Counted {
        pool: super::pool::BlockPool::new(kv_blocks),
        seqs: Vec::new(),
        block,
        root: None,
    };
    drive(
        &mut exec,
        requests,
        block,
        max_seqs,
        context,
        prefix,
        |_, _, _| {},
    )
}
