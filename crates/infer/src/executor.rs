//! The executor: what carries out the scheduler's decisions (`schedule`). [`Single`] drives one
//! worker, a [`Worker`] on one rank (its weights, KV caches and steps); [`Replay`] applies the
//! same block rule to the trace's lengths with no model, which is the plan's prediction of a run.
//! A tensor-parallel group or prefill/decode roles are further executors behind the same trait.

use super::blocks::{BlockManager, SeqId};
use super::prefill_chunks;
use super::sample::{pick, Sampling};
use super::Worker;
use data::SplitMix64;
use engine::backend::InferOps;
use engine::error::EngineError;

/// What the scheduler asks of whatever runs its decisions: admit a request (prefill), decode a
/// batch, release a sequence, and count blocks.
pub trait Executor {
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

pub struct Single<'a, B: InferOps> {
    worker: &'a mut Worker<B>,
    sampling: Sampling,
    rng: SplitMix64,
    logits: Vec<f32>,
    /// The shared prompt's sequence and length.
    root: Option<(SeqId, usize)>,
}

impl<'a, B: InferOps> Single<'a, B> {
    /// Drives `worker`, sampling each next token with `sampling` from a generator seeded `seed`.
    pub fn new(worker: &'a mut Worker<B>, sampling: Sampling, seed: u64) -> Self {
        Single {
            worker,
            sampling,
            rng: SplitMix64::new(seed),
            logits: Vec::new(),
            root: None,
        }
    }
}

impl<B: InferOps> Executor for Single<'_, B> {
    fn free_blocks(&self) -> usize {
        self.worker.free_blocks()
    }
    fn share(&mut self, prefix: &[u32]) -> Result<(), EngineError> {
        let root = self.worker.new_sequence();
        self.worker.prefill(root, prefix, &mut self.logits)?;
        self.root = Some((root, prefix.len()));
        Ok(())
    }
    fn admit(&mut self, tokens: &[u32]) -> Result<(SeqId, u32), EngineError> {
        let (seq, rest) = match self.root {
            Some((root, n)) => (self.worker.fork(root), &tokens[n..]),
            None => (self.worker.new_sequence(), tokens),
        };
        // The prompt's logits give the first token; the first decode feeds it.
        self.worker.prefill(seq, rest, &mut self.logits)?;
        Ok((seq, pick(&self.logits, &self.sampling, &mut self.rng)))
    }
    fn unshare(&mut self) {
        if let Some((root, _)) = self.root.take() {
            self.worker.free(root);
        }
    }
    fn decode(&mut self, seqs: &[SeqId], tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        self.worker.decode(seqs, tokens, &mut self.logits)?;
        let v = self.worker.vocab();
        Ok(self
            .logits
            .chunks_exact(v)
            .map(|row| pick(row, &self.sampling, &mut self.rng))
            .collect())
    }
    fn blocks_needed(&self, seq: SeqId) -> usize {
        self.worker.blocks_needed(seq, 1)
    }
    fn used_blocks(&self) -> usize {
        self.worker.blocks.used_blocks()
    }
    fn release(&mut self, seq: SeqId) {
        self.worker.free(seq)
    }
}

/// The replay's executor: the worker's block rule (`BlockManager`) over the trace's lengths,
/// with the worker's prefill chunks and sliding-window release, and no model.
pub struct Replay {
    blocks: BlockManager,
    chunk: usize,
    root: Option<(SeqId, usize)>,
}

impl Replay {
    /// An empty pool of `blocks` blocks of `block` tokens, prefilled in chunks of `chunk`.
    pub fn new(blocks: usize, block: usize, chunk: usize, window: Option<usize>) -> Replay {
        Replay {
            blocks: BlockManager::new(blocks, block, window),
            chunk,
            root: None,
        }
    }

    /// What `Worker::prefill` does to the block tables: a step per chunk, each followed by the
    /// window's release.
    fn prefill(&mut self, seq: SeqId, n: usize) {
        let mut slots = Vec::new();
        for range in prefill_chunks(n, self.chunk, 1) {
            self.blocks
                .grow(seq, range.len(), &mut slots, &mut Vec::new());
            self.blocks.release_outside_window(seq);
        }
    }
}

impl Executor for Replay {
    fn free_blocks(&self) -> usize {
        self.blocks.free_blocks()
    }
    fn share(&mut self, prefix: &[u32]) -> Result<(), EngineError> {
        let root = self.blocks.new_sequence();
        self.prefill(root, prefix.len());
        self.root = Some((root, prefix.len()));
        Ok(())
    }
    fn admit(&mut self, tokens: &[u32]) -> Result<(SeqId, u32), EngineError> {
        let (seq, rest) = match self.root {
            Some((root, n)) => (self.blocks.fork(root), tokens.len() - n),
            None => (self.blocks.new_sequence(), tokens.len()),
        };
        self.prefill(seq, rest);
        Ok((seq, 0))
    }
    fn decode(&mut self, seqs: &[SeqId], _tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        let mut slots = Vec::new();
        for &s in seqs {
            self.blocks.grow(s, 1, &mut slots, &mut Vec::new());
        }
        for &s in seqs {
            self.blocks.release_outside_window(s);
        }
        Ok(vec![0; seqs.len()])
    }
    fn blocks_needed(&self, seq: SeqId) -> usize {
        self.blocks.blocks_needed(seq, 1)
    }
    fn used_blocks(&self) -> usize {
        self.blocks.used_blocks()
    }
    fn release(&mut self, seq: SeqId) {
        self.blocks.free(seq)
    }
    fn unshare(&mut self) {
        if let Some((root, _)) = self.root.take() {
            self.blocks.free(root);
        }
    }
}
