//! `Counted`: the one place bytes are counted. It wraps any `Collective` (in-process, MPI, NCCL,
//! a sub-group) and records each successful call in `CommStats` by the ring model, so backends
//! only move bytes and the engine reads one counter whatever the backend. It also sums the time
//! its caller spends inside calls (`Counted::blocked`): with `Overlapped` below it, what a started
//! gather costs the caller is only its `wait`.
//!
//! Sizes counted per call: all-reduce, broadcast and the in-place forms their buffer;
//! reduce-scatter its input (world × shard); all-gather its output (world × shard), a started
//! one when it starts; barrier, split and `wait` nothing.
//!
//! ```
//! use comm::{Collective, Counted, ReduceOp, Solo};
//! let mut c = Counted::new(Solo::new());
//! c.all_reduce([1.0f32; 4].as_mut_slice().into(), ReduceOp::Sum).unwrap();
//! assert_eq!(c.stats().all_reduce.calls, 1);
//! assert_eq!(c.stats().total_sent_bytes(), 0); // a world of one moves nothing
//! ```

use crate::{Buf, BufMut, Collective, CollectiveKind, CommStats, ReduceOp, Result, Ticket};
use std::time::{Duration, Instant};

/// An endpoint, the bytes it has moved and the time its caller spent in it.
pub struct Counted<C> {
    inner: C,
    stats: CommStats,
    blocked: Duration,
}

impl<C: Collective> Counted<C> {
    pub fn new(inner: C) -> Counted<C> {
        Counted {
            inner,
            stats: CommStats::default(),
            blocked: Duration::ZERO,
        }
    }

    /// Time the caller has spent inside this endpoint's calls so far (a started gather counts
    /// only its start and its `wait`).
    pub fn blocked(&self) -> Duration {
        self.blocked
    }

    /// Bytes this rank moved so far, per collective kind (ring model, see `CommStats`).
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    fn count<T>(
        &mut self,
        kind: CollectiveKind,
        bytes: usize,
        since: Instant,
        result: Result<T>,
    ) -> Result<T> {
        self.blocked += since.elapsed();
        if result.is_ok() {
            let world = self.inner.world_size();
            self.stats.record(kind, bytes as u64, world);
        }
        result
    }
}

impl<C: Collective> Collective for Counted<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let bytes = buf.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.all_reduce(buf, op);
        self.count(CollectiveKind::AllReduce, bytes, t0, r)
    }

    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let bytes = input.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.reduce_scatter(input, output, op);
        self.count(CollectiveKind::ReduceScatter, bytes, t0, r)
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        let bytes = output.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.all_gather(input, output);
        self.count(CollectiveKind::AllGather, bytes, t0, r)
    }

    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let bytes = buf.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.reduce_scatter_in_place(buf, op);
        self.count(CollectiveKind::ReduceScatter, bytes, t0, r)
    }

    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()> {
        let bytes = buf.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.all_gather_in_place(buf);
        self.count(CollectiveKind::AllGather, bytes, t0, r)
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let bytes = buf.size_bytes();
        let t0 = Instant::now();
        let r = self.inner.broadcast(buf, root);
        self.count(CollectiveKind::Broadcast, bytes, t0, r)
    }

    fn barrier(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.barrier();
        self.count(CollectiveKind::Barrier, 0, t0, r)
    }

    fn send_bytes(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        self.inner.send_bytes(bytes, dest)
    }

    fn recv_bytes(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        self.inner.recv_bytes(out, src)
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }

    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>> {
        let t0 = Instant::now();
        let r = self.inner.split(color, key);
        self.count(CollectiveKind::Split, 0, t0, r)
    }

    unsafe fn start_all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<Ticket> {
        let bytes = output.size_bytes();
        let t0 = Instant::now();
        // SAFETY: the caller's promise, passed on.
        let r = unsafe { self.inner.start_all_gather(input, output) };
        self.count(CollectiveKind::AllGather, bytes, t0, r)
    }

    fn wait(&mut self, ticket: Ticket) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.wait(ticket);
        self.blocked += t0.elapsed();
        r
    }
}
