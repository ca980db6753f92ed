//! Stored size of quantized weights: the codes plus one scale (and, asymmetric, one zero point)
//! per group. Pure arithmetic, for the planner and for reports.
//!
//! Zero points are stored at the code width (4 bits for int4, 8 for int8), as GPTQ/AWQ pack them;
//! scales at the width of their float format (fp16 by default). Example: int4, group 128, fp16
//! scales, symmetric: 4 + 16/128 = 4.125 bits per weight; asymmetric adds 4/128 → 4.15625.

use super::{Scheme, Symmetry};
use crate::Format;
use serde::Serialize;

/// Everything that decides how many bits quantized weights take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StorageSpec {
    pub scheme: Scheme,
    /// Weights that share one scale (a row's length for per-channel, the tensor's size for
    /// per-tensor).
    pub group_size: u64,
    /// The float format scales are stored in.
    pub scale_format: Format,
    pub symmetry: Symmetry,
}

impl StorageSpec {
    /// int4, groups of 128, fp16 scales, symmetric: the common GPTQ/AWQ-style setting.
    pub fn int4_g128() -> StorageSpec {
        StorageSpec {
            scheme: Scheme::Int4,
            group_size: 128,
            scale_format: Format::F16,
            symmetry: Symmetry::Symmetric,
        }
    }

    /// Bits of metadata per group: the scale, plus the zero point when asymmetric.
    pub fn group_overhead_bits(&self) -> u64 {
        let zero_point_bits = match self.symmetry {
            Symmetry::Symmetric => 0,
            Symmetry::Asymmetric => self.scheme.code_bits() as u64,
        };
        self.scale_format.bits() as u64 + zero_point_bits
    }
}

/// Average stored bits per weight: code bits + (scale bits + zero-point bits) / group size.
///
/// Panics if `group_size` is 0 (a programmer error: callers validate group sizes first).
pub fn bits_per_weight(spec: &StorageSpec) -> f64 {
    assert!(spec.group_size > 0, "group size must be positive");
    spec.scheme.code_bits() as f64 + spec.group_overhead_bits() as f64 / spec.group_size as f64
}

/// Bytes to store `n_weights` weights: codes packed tightly, one scale (and zero point) per
/// started group, the total rounded up to whole bytes.
pub fn stored_bytes(n_weights: u64, spec: &StorageSpec) -> u64 {
    assert!(spec.group_size > 0, "group size must be positive");
    let n_groups = n_weights.div_ceil(spec.group_size);
    let bits = n_weights * spec.scheme.code_bits() as u64 + n_groups * spec.group_overhead_bits();
    bits.div_ceil(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_group128_fp16_symmetric_is_4_125_bits() {
        assert_eq!(bits_per_weight(&StorageSpec::int4_g128()), 4.125);
        let asym = StorageSpec {
            symmetry: Symmetry::Asymmetric,
            ..StorageSpec::int4_g128()
        };
        assert_eq!(bits_per_weight(&asym), 4.15625);
        // 4096 × 4096 weights at 4.125 bits: 8,650,752 bytes.
        assert_eq!(
            stored_bytes(4096 * 4096, &StorageSpec::int4_g128()),
            8_650_752
        );
    }

    #[test]
    fn nf4_block64_fp32_scales_is_4_5_bits() {
        // QLoRA without double quantization: one fp32 absmax per 64 weights = 0.5 bits.
        let spec = StorageSpec {
            scheme: Scheme::Nf4,
            group_size: 64,
            scale_format: Format::F32,
            symmetry: Symmetry::Symmetric,
        };
        assert_eq!(bits_per_weight(&spec), 4.5);
    }
}
