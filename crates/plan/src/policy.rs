//! Precision policies: bytes per element of weights, gradients, master copy and optimizer moments.
//!
//! fp32 and AMP keep fp32 weights and gradients (AMP adds autocast's 16-bit copies); bf16/fp16
//! keep 16-bit weights and gradients with an fp32 master copy (the classic 2 + 2 + 12 bytes with
//! Adam); pure bf16 keeps everything in bf16. Not here: sharding (the runtimes).
//! Example: `Policy::of(Precision::Bf16).optimizer_bytes(Optimizer::AdamW, 1)` is 12.

use crate::setup::{Optimizer, Precision};

/// Bytes per element of each model state under a precision policy.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub weight: u64,
    pub grad: u64,
    /// fp32 master copy (0 where the weights are the master).
    pub master: u64,
    /// One optimizer moment.
    pub moment: u64,
    /// Autocast keeps 16-bit copies of the fp32 weights for the forward.
    pub autocast_copy: bool,
}

impl Policy {
    pub fn of(precision: Precision) -> Policy {
        let (weight, grad, master, moment) = match precision {
            Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16 => (4, 4, 0, 4),
            Precision::Bf16 | Precision::Fp16 => (2, 2, 4, 4),
            Precision::PureBf16 => (2, 2, 0, 2),
        };
        Policy {
            weight,
            grad,
            master,
            moment,
            autocast_copy: matches!(precision, Precision::AmpBf16 | Precision::AmpFp16),
        }
    }

    /// Optimizer-state bytes (master copy and moments) of `n` elements: AdamW two moments,
    /// SGD one momentum buffer, 8-bit Adam two int8 moments with an fp32 absmax per 256.
    pub fn optimizer_bytes(&self, optimizer: Optimizer, n: u64) -> u64 {
        let moments = match optimizer {
            Optimizer::AdamW => 2 * self.moment * n,
            Optimizer::Sgd => self.moment * n,
            Optimizer::AdamW8bit => 2 * (n + 4 * n.div_ceil(256)),
        };
        self.master * n + moments
    }
}
