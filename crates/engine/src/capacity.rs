//! Does the run fit? The memory it needs (the plan, exactly as it will run) against the device's
//! capacity (`--device-memory`) and, on the CPU backend, against the RAM this process may use
//! (`/proc/meminfo`'s MemAvailable, capped by a cgroup limit where one is set). A refusal carries
//! the breakdown at the plan's peak, in GiB, adding up to the total, and the advisor's cheapest fix.
//!
//! Example: `host_available()` is `Some(HostMemory { bytes: 24_232_864 * 1024, .. })` on a
//! 24 GiB machine with nothing else running.

use plan::buffer::{Category, Phase};
use plan::units::human_bytes;
use std::fmt;

/// What a refusal compared the run's bytes with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `--device-memory`: one rank's slab.
    Device,
    /// Host RAM: every rank's slab and host-offloaded state together (`source` says where the
    /// number came from).
    HostRam { source: String },
}

/// A run that does not fit, with the facts to fix it.
#[derive(Clone, Debug, PartialEq)]
pub struct NoFit {
    pub limit: Limit,
    /// What the run needs of `limit` (for `HostRam`: all ranks together).
    pub needed_bytes: u64,
    pub capacity_bytes: u64,
    /// Ranks the needed bytes count (1 for `Device`).
    pub ranks: u32,
    /// One rank's live bytes per category at its peak (`Category as usize`), and that phase.
    pub at_peak: [u64; 6],
    pub phase: Phase,
    /// One rank's bytes beyond its peak: slab layout (buffers that cannot share an offset) and
    /// alignment padding.
    pub layout_bytes: u64,
    /// One rank's state offloaded to host RAM (only counted against `HostRam`).
    pub host_bytes: u64,
    /// The `fit` advisor's cheapest way to fit, when it has one.
    pub advice: Option<String>,
}

impl fmt::Display for NoFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needed = human_bytes(self.needed_bytes);
        let capacity = human_bytes(self.capacity_bytes);
        match &self.limit {
            Limit::Device => write!(
                f,
                "the run needs {needed} ({} bytes) but the device holds {capacity} ({} bytes)",
                self.needed_bytes, self.capacity_bytes
            )?,
            Limit::HostRam { source } => write!(
                f,
                "the run needs {needed} of host RAM but this machine has {capacity} available \
                 ({source}); nothing was allocated"
            )?,
        }
        let mut parts: Vec<String> = Category::ALL
            .iter()
            .zip(self.at_peak)
            .filter(|(_, b)| *b > 0)
            .map(|(c, b)| format!("{} {}", c.label(), human_bytes(b)))
            .collect();
        if self.layout_bytes > 0 {
            parts.push(format!(
                "slab layout and alignment {}",
                human_bytes(self.layout_bytes)
            ));
        }
        if self.host_bytes > 0 && matches!(self.limit, Limit::HostRam { .. }) {
            parts.push(format!("offloaded state {}", human_bytes(self.host_bytes)));
        }
        let per_rank = self.at_peak.iter().sum::<u64>()
            + self.layout_bytes
            + match self.limit {
                Limit::HostRam { .. } => self.host_bytes,
                Limit::Device => 0,
            };
        write!(
            f,
            ". Per rank, at its peak ({}): {} = {}",
            phase_name(self.phase),
            parts.join(" + "),
            human_bytes(per_rank)
        )?;
        if self.ranks > 1 {
            write!(f, ", x {} ranks", self.ranks)?;
        }
        match (&self.advice, &self.limit) {
            (Some(a), _) => write!(f, ". To fit: {a}"),
            (None, Limit::Device) => write!(
                f,
                ". The advisor found no nearby setup that fits: give more --device-memory, more \
                 --ranks with --zero 3, or a smaller --model"
            ),
            (None, Limit::HostRam { .. }) => write!(
                f,
                ". The advisor found no nearby setup that fits: use a smaller --model (e.g. \
                 gpt2-124m), --batch or --seq, fewer --ranks, or --precision bf16 with --offload \
                 optimizer:disk; `frugal fit` plans it for a GPU"
            ),
        }
    }
}

/// A phase as a person reads it.
fn phase_name(phase: Phase) -> String {
    match phase {
        Phase::Embed => "embedding forward".into(),
        Phase::Forward(l) => format!("forward of layer {l}"),
        Phase::Head => "classifier and loss".into(),
        Phase::Backward(l) => format!("backward of layer {l}"),
        Phase::EmbedBackward => "embedding backward".into(),
        Phase::Optimizer => "optimizer step".into(),
        Phase::Prefill => "prefill".into(),
        Phase::Decode => "decode".into(),
    }
}

/// How much RAM this process may still take, and where the number came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMemory {
    pub bytes: u64,
    pub source: String,
}

/// MemAvailable from `/proc/meminfo`, capped by the cgroup's limit less its usage (v2
/// `memory.max`/`memory.current`, or v1 `memory.limit_in_bytes`/`memory.usage_in_bytes`);
/// `None` where neither can be read (not Linux).
pub fn host_available() -> Option<HostMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let available = meminfo.as_deref().and_then(mem_available);
    let cgroup = cgroup_room();
    match (available, cgroup) {
        (Some(a), Some(c)) if c < a => Some(HostMemory {
            bytes: c,
            source: "the cgroup's memory limit less its usage".into(),
        }),
        (Some(a), _) => Some(HostMemory {
            bytes: a,
            source: "MemAvailable in /proc/meminfo".into(),
        }),
        (None, Some(c)) => Some(HostMemory {
            bytes: c,
            source: "the cgroup's memory limit less its usage".into(),
        }),
        (None, None) => None,
    }
}

/// `MemAvailable:  24232864 kB` in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The cgroup's limit less its usage, when a limit is set.
fn cgroup_room() -> Option<u64> {
    let read = |p: &str| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let pairs = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ];
    pairs.iter().find_map(|(limit, usage)| {
        // "max" (v2) does not parse; v1 writes "no limit" as a number near i64::MAX.
        let limit = read(limit).filter(|&l| l < (1u64 << 60))?;
        Some(limit.saturating_sub(read(usage).unwrap_or(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24683584 kB\nMemFree:        21924600 kB\n\
                    MemAvailable:   24232864 kB\n";
        assert_eq!(mem_available(text), Some(24_232_864 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn the_breakdown_adds_up_to_the_total_it_names() {
        let gib = 1u64 << 30;
        let no = NoFit {
            limit: Limit::HostRam {
                source: "MemAvailable in /proc/meminfo".into(),
            },
            needed_bytes: 2 * (10 * gib + gib / 2),
            capacity_bytes: 8 * gib,
            ranks: 2,
            at_peak: [4 * gib, 4 * gib, 0, 2 * gib, 0, 0],
            phase: Phase::Backward(3),
            layout_bytes: gib / 2,
            host_bytes: 0,
            advice: None,
        };
        let text = no.to_string();
        assert!(text.contains("needs 21.00 GiB of host RAM"), "{text}");
        assert!(text.contains("8.00 GiB available"), "{text}");
        assert!(
            text.contains(
                "backward of layer 3): params 4.00 GiB + grads 4.00 GiB + activations 2.00 GiB + \
                 slab layout and alignment 512.00 MiB = 10.50 GiB, x 2 ranks"
            ),
            "{text}"
        );
    }
}
