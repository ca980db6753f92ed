//! `CommStats`: bytes each rank sends and receives, per collective kind, counted as a ring
//! implementation would move them, so numbers compare directly with the ZeRO paper's 2Ψ / 3Ψ.
//!
//! Holds counting only; `Counted` calls `record` once per successful call of the endpoint it
//! wraps, so no backend counts for itself. With `size` the byte
//! size of the full (world-sized) buffer and N ranks, each rank sends and receives:
//!
//! | kind | bytes sent = bytes received, per rank |
//! |---|---|
//! | all_reduce | 2(N−1)/N · size (ring reduce-scatter then ring all-gather) |
//! | reduce_scatter | (N−1)/N · size, size = the input (world × shard) |
//! | all_gather | (N−1)/N · size, size = the output (world × shard) |
//! | broadcast | (N−1)/N · size (a pipelined ring: N−1 copies of size, spread over N ranks) |
//! | barrier | 0 |
//!
//! Divisions round down, per call. With N = 1 nothing moves. Example: stage-0 ZeRO all-reduces
//! Ψ gradient bytes per step, so each rank counts 2(N−1)/N·Ψ ≈ 2Ψ.
//!
//! ```
//! use comm::{CollectiveKind, CommStats};
//! let mut s = CommStats::default();
//! s.record(CollectiveKind::AllReduce, 1000, 4);
//! assert_eq!(s.all_reduce.sent_bytes, 1500);
//! ```

use crate::CollectiveKind;

/// Counters for one collective kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindStats {
    pub calls: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
}

/// Counters for every kind, for one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    pub all_reduce: KindStats,
    pub reduce_scatter: KindStats,
    pub all_gather: KindStats,
    pub broadcast: KindStats,
    pub barrier: KindStats,
    pub split: KindStats,
}

impl CommStats {
    /// The ring-model bytes one rank moves in one call of `kind` on a buffer of `size_bytes`
    /// (as defined in the module docs) in a world of `world_size` ranks.
    pub fn ring_bytes(kind: CollectiveKind, size_bytes: u64, world_size: usize) -> u64 {
        let n = world_size as u64;
        if n == 0 {
            return 0;
        }
        match kind {
            CollectiveKind::AllReduce => 2 * (n - 1) * size_bytes / n,
            CollectiveKind::ReduceScatter
            | CollectiveKind::AllGather
            | CollectiveKind::Broadcast => (n - 1) * size_bytes / n,
            CollectiveKind::Barrier | CollectiveKind::Split => 0,
        }
    }

    /// Counts one successful call.
    pub fn record(&mut self, kind: CollectiveKind, size_bytes: u64, world_size: usize) {
        let bytes = Self::ring_bytes(kind, size_bytes, world_size);
        let k = self.kind_mut(kind);
        k.calls += 1;
        k.sent_bytes += bytes;
        k.received_bytes += bytes;
    }

    pub fn kind(&self, kind: CollectiveKind) -> KindStats {
        match kind {
            CollectiveKind::AllReduce => self.all_reduce,
            CollectiveKind::ReduceScatter => self.reduce_scatter,
            CollectiveKind::AllGather => self.all_gather,
            CollectiveKind::Broadcast => self.broadcast,
            CollectiveKind::Barrier => self.barrier,
            CollectiveKind::Split => self.split,
        }
    }

    fn kind_mut(&mut self, kind: CollectiveKind) -> &mut KindStats {
        match kind {
            CollectiveKind::AllReduce => &mut self.all_reduce,
            CollectiveKind::ReduceScatter => &mut self.reduce_scatter,
            CollectiveKind::AllGather => &mut self.all_gather,
            CollectiveKind::Broadcast => &mut self.broadcast,
            CollectiveKind::Barrier => &mut self.barrier,
            CollectiveKind::Split => &mut self.split,
        }
    }

    /// Bytes sent over all kinds.
    pub fn total_sent_bytes(&self) -> u64 {
        CollectiveKind::ALL
            .iter()
            .map(|&k| self.kind(k).sent_bytes)
            .sum()
    }

    /// `self − earlier`, e.g. the bytes of one training step.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        let d = |a: KindStats, b: KindStats| KindStats {
            calls: a.calls - b.calls,
            sent_bytes: a.sent_bytes - b.sent_bytes,
            received_bytes: a.received_bytes - b.received_bytes,
        };
        CommStats {
            all_reduce: d(self.all_reduce, earlier.all_reduce),
            reduce_scatter: d(self.reduce_scatter, earlier.reduce_scatter),
            all_gather: d(self.all_gather, earlier.all_gather),
            broadcast: d(self.broadcast, earlier.broadcast),
            barrier: d(self.barrier, earlier.barrier),
            split: d(self.split, earlier.split),
        }
    }
}
