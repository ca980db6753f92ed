//! Planned against measured memory, per rank, and the collective that brings every rank's to
//! every rank: the report reduces over the communicator instead of reading other ranks' memory,
//! so it works the same when ranks are processes.
//!
//! Example: `let all = trainer.gather_memory()?; assert!(all.iter().all(|r| r.planned == r.measured));`

use super::Trainer;
use engine::backend::TrainOps;
use engine::error::EngineError;
use plan::buffer::Device;

/// One side of the comparison: live bytes per category at the peak (they sum to the peak, the
/// breakdown `frugal plan` prints), the peak, and what the slab reserves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    pub at_peak_bytes: [u64; 6],
    pub peak_bytes: u64,
    pub reserved_bytes: u64,
}

impl MemoryBreakdown {
    fn words(&self) -> [u64; 8] {
        let mut w = [0u64; 8];
        w[..6].copy_from_slice(&self.at_peak_bytes);
        (w[6], w[7]) = (self.peak_bytes, self.reserved_bytes);
        w
    }

    fn from_words(w: &[u64]) -> MemoryBreakdown {
        let mut at_peak_bytes = [0u64; 6];
        at_peak_bytes.copy_from_slice(&w[..6]);
        MemoryBreakdown {
            at_peak_bytes,
            peak_bytes: w[6],
            reserved_bytes: w[7],
        }
    }
}

/// One rank's plan and what its arena measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankMemory {
    pub rank: usize,
    pub planned: MemoryBreakdown,
    pub measured: MemoryBreakdown,
    /// The peak resident memory of the process this rank ran in (Linux `VmHWM`; 0 where the
    /// system does not report it). Thread ranks share one process, MPI ranks have their own.
    pub process_peak_rss_bytes: u64,
}

/// This process's peak resident set size (`VmHWM` in /proc/self/status), 0 if unknown.
pub fn process_peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl<B: TrainOps> Trainer<B> {
    /// This rank's planned and measured bytes.
    pub fn memory(&self) -> RankMemory {
        let (_, at_peak_bytes) = self.plan.at_peak(Device::Gpu);
        let planned = MemoryBreakdown {
            at_peak_bytes,
            peak_bytes: self.plan.peak_bytes(Device::Gpu),
            reserved_bytes: plan_frugal::assign_offsets(&self.plan, Device::Gpu).slab_bytes,
        };
        let m = self.measured();
        let measured = MemoryBreakdown {
            at_peak_bytes: m.at_peak_bytes,
            peak_bytes: m.peak_bytes,
            reserved_bytes: m.reserved_bytes,
        };
        RankMemory {
            rank: self.rank(),
            planned,
            measured,
            process_peak_rss_bytes: process_peak_rss_bytes(),
        }
    }

    /// Every rank's [`RankMemory`], in rank order: a collective every rank calls.
    pub fn gather_memory(&mut self) -> Result<Vec<RankMemory>, EngineError> {
        let mine = self.memory();
        let mut words = mine.planned.words().to_vec();
        words.extend(mine.measured.words());
        words.push(mine.process_peak_rss_bytes);
        let all = self.world_comm().all_gather_u64(&words)?;
        Ok(all
            .chunks_exact(17)
            .enumerate()
            .map(|(rank, w)| RankMemory {
                rank,
                planned: MemoryBreakdown::from_words(&w[..8]),
                measured: MemoryBreakdown::from_words(&w[8..16]),
                process_peak_rss_bytes: w[16],
            })
            .collect())
    }
}
