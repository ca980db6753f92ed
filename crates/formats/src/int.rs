//! Integer formats (int8, uint8, int4) and NF4, QLoRA's 4-bit "normal float" code book.
//!
//! Integers are plain two's complement (or unsigned) codes: encoding rounds to nearest, ties to
//! even, and saturates at the ends of the range. NF4 is a look-up table of 16 levels in [-1, 1];
//! encoding picks the nearest level (a tie picks the lower code). Scales and zero points live in
//! `quant`, not here. Example: `IntRange::INT4.encode(7.6)` is `7` (saturated), and
//! `nf4_nearest(0.1)` is code 8 (0.0796).

use serde::Serialize;

/// The code range of an integer format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IntRange {
    pub bits: u32,
    pub signed: bool,
}

impl IntRange {
    pub const INT8: IntRange = IntRange {
        bits: 8,
        signed: true,
    };
    pub const UINT8: IntRange = IntRange {
        bits: 8,
        signed: false,
    };
    pub const INT4: IntRange = IntRange {
        bits: 4,
        signed: true,
    };
    pub const UINT4: IntRange = IntRange {
        bits: 4,
        signed: false,
    };

    /// Smallest code: -2^(b-1) signed, 0 unsigned.
    pub fn min(&self) -> i32 {
        if self.signed {
            -(1 << (self.bits - 1))
        } else {
            0
        }
    }

    /// Largest code: 2^(b-1) - 1 signed, 2^b - 1 unsigned.
    pub fn max(&self) -> i32 {
        if self.signed {
            (1 << (self.bits - 1)) - 1
        } else {
            (1 << self.bits) - 1
        }
    }

    /// Rounds to nearest (ties to even) and clamps into the range. `x` must not be NaN.
    pub fn encode(&self, x: f64) -> i32 {
        assert!(
            !x.is_nan(),
            "integer codes have no NaN; callers reject NaN first"
        );
        x.round_ties_even()
            .clamp(self.min() as f64, self.max() as f64) as i32
    }

    /// The code as the low `bits` of a two's complement word.
    pub fn to_bits(&self, code: i32) -> u32 {
        (code as u32) & ((1u32 << self.bits) - 1)
    }

    /// Reads `bits` back into the signed or unsigned code.
    pub fn from_bits(&self, bits: u32) -> i32 {
        let masked = bits & ((1u32 << self.bits) - 1);
        if self.signed && masked >> (self.bits - 1) == 1 {
            masked as i32 - (1 << self.bits)
        } else {
            masked as i32
        }
    }
}

/// The 16 NF4 levels of QLoRA (Dettmers et al. 2023), as bitsandbytes ships them: quantiles of a
/// standard normal, 8 positive and 7 negative plus an exact zero, normalised to [-1, 1]. A test
/// re-derives them from the normal quantile function.
pub const NF4_LEVELS: [f64; 16] = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
];

/// The NF4 code (0..16) whose level is nearest to `x`; values beyond ±1 take the end levels.
/// `x` must not be NaN.
pub fn nf4_nearest(x: f64) -> u32 {
    assert!(!x.is_nan(), "NF4 has no NaN; callers reject NaN first");
    // Midpoints between neighbours decide; `x` at a midpoint goes to the lower code.
    let mut code = 0;
    for i in 1..NF4_LEVELS.len() {
        let midpoint = (NF4_LEVELS[i - 1] + NF4_LEVELS[i]) / 2.0;
        if x > midpoint {
            code = i as u32;
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_saturation() {
        assert_eq!((IntRange::INT8.min(), IntRange::INT8.max()), (-128, 127));
        assert_eq!((IntRange::UINT8.min(), IntRange::UINT8.max()), (0, 255));
        assert_eq!((IntRange::INT4.min(), IntRange::INT4.max()), (-8, 7));
        assert_eq!(IntRange::INT4.encode(7.6), 7);
        assert_eq!(IntRange::INT8.encode(-300.0), -128);
        assert_eq!(IntRange::INT8.encode(2.5), 2);
        assert_eq!(IntRange::INT8.encode(3.5), 4);
        for code in -8..=7 {
            let r = IntRange::INT4;
            assert_eq!(r.from_bits(r.to_bits(code)), code);
        }
    }

    #[test]
    fn nf4_picks_the_nearest_level() {
        for (code, level) in NF4_LEVELS.iter().enumerate() {
            assert_eq!(nf4_nearest(*level), code as u32);
        }
        assert_eq!(nf4_nearest(0.1), 8);
        assert_eq!(nf4_nearest(5.0), 15);
        assert_eq!(nf4_nearest(-5.0), 0);
    }
}
