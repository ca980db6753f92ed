//! `Counted`: the one place bytes are counted. It wraps any `Collective` (in-process, MPI, NCCL,
//! a sub-group) and records each successful call in `CommStats` by the ring model, so backends
//! only move bytes and the engine reads one counter whatever the backend.
//!
//! Sizes counted per call: all-reduce, broadcast and the in-place forms their buffer;
//! reduce-scatter its input (world × shard); all-gather its output (world × shard); barrier and
//! split nothing.
//!
//! ```
//! use comm::{Collective, Counted, ReduceOp, Solo};
//! let mut c = Counted::new(Solo::new());
//! c.all_reduce([1.0f32; 4].as_mut_slice().into(), ReduceOp::Sum).unwrap();
//! assert_eq!(c.stats().all_reduce.calls, 1);
//! assert_eq!(c.stats().total_sent_bytes(), 0); // a world of one moves nothing
//! ```

use crate::{Buf, BufMut, Collective, CollectiveKind, CommError, CommStats, ReduceOp};

/// An endpoint and the bytes it has moved.
pub struct Counted<C> {
    inner: C,
    stats: CommStats,
}

impl<C: Collective> Counted<C> {
    pub fn new(inner: C) -> Counted<C> {
        Counted {
            inner,
            stats: CommStats::default(),
        }
    }

    /// Bytes this rank moved so far, per collective kind (ring model, see `CommStats`).
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    fn count<T>(
        &mut self,
        kind: CollectiveKind,
        bytes: usize,
        result: Result<T, CommError>,
    ) -> Result<T, CommError> {
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

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        let bytes = buf.size_bytes();
        let r = self.inner.all_reduce(buf, op);
        self.count(CollectiveKind::AllReduce, bytes, r)
    }

    fn reduce_scatter(
        &mut self,
        input: Buf<'_>,
        output: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let bytes = input.size_bytes();
        let r = self.inner.reduce_scatter(input, output, op);
        self.count(CollectiveKind::ReduceScatter, bytes, r)
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<(), CommError> {
        let bytes = output.size_bytes();
        let r = self.inner.all_gather(input, output);
        self.count(CollectiveKind::AllGather, bytes, r)
    }

    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        let bytes = buf.size_bytes();
        let r = self.inner.reduce_scatter_in_place(buf, op);
        self.count(CollectiveKind::ReduceScatter, bytes, r)
    }

    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<(), CommError> {
        let bytes = buf.size_bytes();
        let r = self.inner.all_gather_in_place(buf);
        self.count(CollectiveKind::AllGather, bytes, r)
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<(), CommError> {
        let bytes = buf.size_bytes();
        let r = self.inner.broadcast(buf, root);
        self.count(CollectiveKind::Broadcast, bytes, r)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        let r = self.inner.barrier();
        self.count(CollectiveKind::Barrier, 0, r)
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }

    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>, CommError> {
        let r = self.inner.split(color, key);
        self.count(CollectiveKind::Split, 0, r)
    }
}
