//! The block manager: the one KV-block rule, used by the worker that runs the model and by the
//! plan's replay of a schedule (`schedule::simulate`), so the two cannot drift apart.
//!
//! Fixed-size blocks are shared by every sequence (vLLM's block manager): a free list and a
//! reference count per block, so forked sequences share their common prefix's blocks and a write
//! into a shared block copies it first (copy-on-write). A sequence is its block table and its
//! length; token `p` lives in slot `p % block` of block `blocks[p / block]`. Under a sliding
//! window on every layer, blocks no later row can see go back to the pool after each step.
//!
//! Example:
//! ```
//! use infer::blocks::BlockManager;
//! let mut m = BlockManager::new(4, 2, None);
//! let a = m.new_sequence();
//! let (mut slots, mut copies) = (Vec::new(), Vec::new());
//! m.grow(a, 3, &mut slots, &mut copies);
//! assert_eq!(slots, [(0, 0), (0, 1), (1, 0)]);
//! let b = m.fork(a); // shares both blocks
//! assert_eq!(m.blocks_needed(b, 1), 1); // its half-full last block is copied on write
//! ```

/// A block-table entry whose block went back to the pool: its tokens fell out of every layer's
/// sliding window, and no row reads them again.
pub const FREED: u32 = u32::MAX;

/// A sequence handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub usize);

/// A sequence's cached tokens.
#[derive(Clone, Debug, Default)]
pub struct Sequence {
    pub blocks: Vec<u32>,
    pub len: usize,
}

/// Blocks and their reference counts.
#[derive(Clone, Debug)]
struct BlockPool {
    refs: Vec<u32>,
    free: Vec<u32>,
}

impl BlockPool {
    fn new(n: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; n],
            // Popped from the end: block 0 first.
            free: (0..n as u32).rev().collect(),
        }
    }

    /// A free block with one reference, or `None` when the pool is exhausted.
    fn alloc(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        Some(b)
    }

    fn retain(&mut self, b: u32) {
        assert!(self.refs[b as usize] > 0, "retaining free block {b}");
        self.refs[b as usize] += 1;
    }

    /// Drops one reference; the block is free again at zero.
    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "releasing free block {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    fn is_shared(&self, b: u32) -> bool {
        self.refs[b as usize] > 1
    }
}

/// Every sequence's block table over one pool of blocks.
#[derive(Clone, Debug)]
pub struct BlockManager {
    pool: BlockPool,
    seqs: Vec<Option<Sequence>>,
    /// Tokens per block.
    block: usize,
    /// The sliding window every layer attends within, in tokens (`None`: full attention on some
    /// layer, nothing is released before the sequence ends).
    window: Option<usize>,
}

impl BlockManager {
    /// `blocks` blocks of `block` tokens; `window` as the model's sliding window on every layer.
    pub fn new(blocks: usize, block: usize, window: Option<usize>) -> BlockManager {
        BlockManager {
            pool: BlockPool::new(blocks),
            seqs: Vec::new(),
            block,
            window,
        }
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block
    }

    /// Tokens the live blocks of every sequence hold (a token shared by forks counts once per
    /// sequence); with the blocks in use, the paged cache's waste.
    pub fn held_tokens(&self) -> usize {
        self.seqs
            .iter()
            .flatten()
            .map(|s| s.len - self.block * s.blocks.iter().filter(|&&b| b == FREED).count())
            .sum()
    }

    /// A new, empty sequence (a handle freed earlier is reused).
    pub fn new_sequence(&mut self) -> SeqId {
        let seq = Sequence::default();
        match self.seqs.iter().position(Option::is_none) {
            Some(i) => {
                self.seqs[i] = Some(seq);
                SeqId(i)
            }
            None => {
                self.seqs.push(Some(seq));
                SeqId(self.seqs.len() - 1)
            }
        }
    }

    /// A live sequence; panics on a freed handle (a caller's bug).
    pub fn seq(&self, id: SeqId) -> &Sequence {
        self.seqs[id.0].as_ref().expect("a live sequence")
    }

    /// A new sequence sharing `id`'s cached tokens (its blocks, copied on write).
    pub fn fork(&mut self, id: SeqId) -> SeqId {
        let src = self.seq(id).clone();
        for &b in src.blocks.iter().filter(|&&b| b != FREED) {
            self.pool.retain(b);
        }
        let new = self.new_sequence();
        self.seqs[new.0] = Some(src);
        new
    }

    /// Frees `id` and the blocks no other sequence shares.
    pub fn free(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs[id.0].take() {
            for b in seq.blocks.into_iter().filter(|&b| b != FREED) {
                self.pool.release(b);
            }
        }
    }

    /// Keeps the first `len` tokens of `id` (speculative decoding's rollback).
    pub fn truncate(&mut self, id: SeqId, len: usize) {
        let seq = self.seqs[id.0].as_mut().expect("a live sequence");
        assert!(len <= seq.len);
        seq.len = len;
        while seq.blocks.len() > len.div_ceil(self.block) {
            let b = seq.blocks.pop().expect("a block");
            assert_ne!(b, FREED, "rolled back past the sliding window's slack");
            self.pool.release(b);
        }
    }

    /// Blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.pool.free.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.pool.refs.len() - self.free_blocks()
    }

    /// Blocks `id` needs to grow by `n` tokens (new blocks, and a copy of a shared last block).
    pub fn blocks_needed(&self, id: SeqId, n: usize) -> usize {
        let s = self.seq(id);
        let block = self.block;
        let new = (s.len + n).div_ceil(block) - s.len.div_ceil(block);
        let cow = s.len % block != 0 && self.pool.is_shared(*s.blocks.last().expect("a block"));
        new + usize::from(cow && n > 0)
    }

    /// Appends `n` tokens to `id`, pushing each new token's (block, slot) to `slots` and each
    /// copy-on-write (from, to) to `copies`: the caller copies those blocks' contents before it
    /// writes the new tokens. Room must have been checked (`blocks_needed` ≤ `free_blocks`).
    pub fn grow(
        &mut self,
        id: SeqId,
        n: usize,
        slots: &mut Vec<(u32, u32)>,
        copies: &mut Vec<(u32, u32)>,
    ) {
        let block = self.block;
        let seq = self.seqs[id.0].as_mut().expect("a live sequence");
        for p in seq.len..seq.len + n {
            let (bi, slot) = (p / block, p % block);
            if slot == 0 {
                seq.blocks.push(self.pool.alloc().expect("room checked"));
            } else if self.pool.is_shared(seq.blocks[bi]) {
                let (old, new) = (seq.blocks[bi], self.pool.alloc().expect("room checked"));
                copies.push((old, new));
                self.pool.release(old);
                seq.blocks[bi] = new;
            }
            slots.push((seq.blocks[bi], slot as u32));
        }
        seq.len += n;
    }

    /// Under a sliding window on every layer, returns to the pool the blocks of `id` that no
    /// later row can see (a ring of about `window` positions per sequence, as vLLM frees them),
    /// keeping one block of slack for speculative decoding's rollback; their table entries
    /// become [`FREED`]. Called after every step.
    pub fn release_outside_window(&mut self, id: SeqId) {
        let Some(w) = self.window else {
            return;
        };
        let block = self.block;
        let seq = self.seqs[id.0].as_mut().expect("a live sequence");
        let first_seen = (seq.len + 1).saturating_sub(w + block);
        for b in seq.blocks.iter_mut().take(first_seen / block) {
            if *b != FREED {
                self.pool.release(*b);
                *b = FREED;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_to_the_pool_when_their_last_holder_releases_them() {
        let mut m = BlockManager::new(2, 4, None);
        let (mut slots, mut copies) = (Vec::new(), Vec::new());
        let a = m.new_sequence();
        m.grow(a, 8, &mut slots, &mut copies);
        assert_eq!(m.free_blocks(), 0, "exhausted");
        let b = m.fork(a);
        m.free(a);
        assert_eq!(m.free_blocks(), 0, "b still holds both");
        m.free(b);
        assert_eq!(m.free_blocks(), 2);
        assert!(copies.is_empty());
    }

    #[test]
    fn a_write_into_a_shared_block_copies_it_first() {
        let mut m = BlockManager::new(4, 4, None);
        let (mut slots, mut copies) = (Vec::new(), Vec::new());
        let a = m.new_sequence();
        m.grow(a, 6, &mut slots, &mut copies);
        let b = m.fork(a);
        assert_eq!(m.blocks_needed(b, 1), 1);
        slots.clear();
        m.grow(b, 1, &mut slots, &mut copies);
        assert_eq!(copies, [(1, 2)], "block 1 copied into the free block 2");
        assert_eq!(slots, [(2, 2)]);
        assert_eq!(m.seq(a).blocks, [0, 1], "the original keeps its blocks");
    }

    #[test]
    fn a_sliding_window_frees_what_no_row_sees_keeping_one_block_of_slack() {
        let mut m = BlockManager::new(8, 4, Some(4));
        let (mut slots, mut copies) = (Vec::new(), Vec::new());
        let a = m.new_sequence();
        m.grow(a, 16, &mut slots, &mut copies);
        m.release_outside_window(a);
        // Row 16 sees positions 13..=16; with a block of slack, blocks before position 9 go.
        assert_eq!(m.seq(a).blocks, [FREED, FREED, 2, 3]);
        assert_eq!(m.free_blocks(), 6);
    }
}
