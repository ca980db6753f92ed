//! The KV block pool: fixed-size blocks shared by every sequence (vLLM's block manager), a free
//! list and a reference count per block, so forked sequences share their common prefix's blocks
//! and a write into a shared block copies it first (copy-on-write). A sequence is its block table
//! and its length; token `p` lives in slot `p % BLOCK` of block `blocks[p / BLOCK]`.
//!
//! Example: `let b = pool.alloc().unwrap(); pool.retain(b); assert!(pool.is_shared(b));`

/// A block-table entry whose block went back to the pool: its tokens fell out of every layer's
/// sliding window, and no row reads them again.
pub const FREED: u32 = u32::MAX;

/// A sequence handle of a `Server`.
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
pub struct BlockPool {
    refs: Vec<u32>,
    free: Vec<u32>,
}

impl BlockPool {
    pub fn new(n: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; n],
            // Popped from the end: block 0 first.
            free: (0..n as u32).rev().collect(),
        }
    }

    /// A free block with one reference, or `None` when the pool is exhausted.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        Some(b)
    }

    pub fn retain(&mut self, b: u32) {
        assert!(self.refs[b as usize] > 0, "retaining free block {b}");
        self.refs[b as usize] += 1;
    }

    /// Drops one reference; the block is free again at zero.
    pub fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "releasing free block {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    pub fn is_shared(&self, b: u32) -> bool {
        self.refs[b as usize] > 1
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn capacity(&self) -> usize {
        self.refs.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used(&self) -> usize {
        self.capacity() - self.free_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_to_the_pool_when_their_last_holder_releases_them() {
        let mut pool = BlockPool::new(2);
        let (a, b) = (pool.alloc().unwrap(), pool.alloc().unwrap());
        assert_eq!((a, b), (0, 1));
        assert!(pool.alloc().is_none(), "exhausted");
        pool.retain(a);
        assert!(pool.is_shared(a));
        pool.release(a);
        assert_eq!(pool.free_count(), 0);
        pool.release(a);
        assert_eq!(pool.free_count(), 1);
        assert_eq!(pool.alloc(), Some(a));
    }
}
