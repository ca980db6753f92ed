//! Binary floating-point layouts (sign | exponent | mantissa), their properties computed from the
//! layout, and one generic encoder/decoder for all of them.
//!
//! The encoder is exact: it works on the integer significand of the f64 input, so rounding is true
//! round-to-nearest-even (ties to an even mantissa), subnormals are produced where the layout has
//! them, and overflow follows the layout's [`Overflow`] rule. It does not know about integer
//! formats or NF4 (see `int.rs`).
//!
//! Example: `FloatLayout::FP16.encode(3.14)` is `0x4248` (0 10000 1001001000), and
//! `FloatLayout::FP16.decode(0x4248)` is `3.140625`.

use serde::Serialize;

/// How NaN (and infinity) are spelled in a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NanEncoding {
    /// IEEE 754: exponent all ones with a non-zero mantissa is NaN; with a zero mantissa, ±inf.
    IeeeExponentAllOnes,
    /// OCP fp8 e4m3: only S.1111.111 is NaN; the rest of the all-ones exponent holds finite values
    /// and there are no infinities.
    AllOnesPattern,
}

/// What encoding does with a finite value beyond the largest finite one (after rounding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// IEEE rule: round to nearest even, and what rounds past the largest finite value is ±inf.
    Infinity,
    /// OCP "satfinite": clamp to ±max (±inf too, since the format has none); NaN stays NaN.
    Saturate,
}

/// A binary float layout: 1 sign bit, `exponent_bits`, `mantissa_bits` (the stored fraction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FloatLayout {
    pub exponent_bits: u32,
    pub mantissa_bits: u32,
    pub has_inf: bool,
    pub nan: NanEncoding,
    pub overflow: Overflow,
}

/// Which kind of number a bit pattern holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Zero,
    Subnormal,
    Normal,
    Infinite,
    Nan,
}

/// The three fields of a float bit pattern, as raw unsigned integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub sign: u32,
    pub exponent: u32,
    pub mantissa: u32,
}

impl FloatLayout {
    pub const FP32: FloatLayout = FloatLayout::ieee(8, 23);
    pub const FP16: FloatLayout = FloatLayout::ieee(5, 10);
    pub const BF16: FloatLayout = FloatLayout::ieee(8, 7);
    pub const FP8_E5M2: FloatLayout = FloatLayout::ieee(5, 2);
    pub const FP8_E4M3: FloatLayout = FloatLayout {
        exponent_bits: 4,
        mantissa_bits: 3,
        has_inf: false,
        nan: NanEncoding::AllOnesPattern,
        overflow: Overflow::Saturate,
    };

    /// An IEEE-754-style layout: infinities, NaN on the all-ones exponent, overflow to ±inf.
    pub const fn ieee(exponent_bits: u32, mantissa_bits: u32) -> FloatLayout {
        FloatLayout {
            exponent_bits,
            mantissa_bits,
            has_inf: true,
            nan: NanEncoding::IeeeExponentAllOnes,
            overflow: Overflow::Infinity,
        }
    }

    /// Total width: sign + exponent + mantissa.
    pub fn bits(&self) -> u32 {
        1 + self.exponent_bits + self.mantissa_bits
    }

    /// bias = 2^(E-1) - 1.
    pub fn bias(&self) -> i32 {
        (1 << (self.exponent_bits - 1)) - 1
    }

    fn exponent_all_ones(&self) -> u32 {
        (1 << self.exponent_bits) - 1
    }

    fn mantissa_mask(&self) -> u32 {
        (1 << self.mantissa_bits) - 1
    }

    /// The sign bit's position mask.
    pub fn sign_mask(&self) -> u32 {
        1 << (self.exponent_bits + self.mantissa_bits)
    }

    /// Bits of the largest finite magnitude: the all-ones exponent is reserved under IEEE; under
    /// OCP e4m3 only its all-ones mantissa is (NaN), so max = S.1111.110.
    pub fn max_finite_bits(&self) -> u32 {
        match self.nan {
            NanEncoding::IeeeExponentAllOnes => {
                ((self.exponent_all_ones() - 1) << self.mantissa_bits) | self.mantissa_mask()
            }
            NanEncoding::AllOnesPattern => {
                (self.exponent_all_ones() << self.mantissa_bits) | (self.mantissa_mask() - 1)
            }
        }
    }

    /// The canonical (quiet) NaN this encoder writes, positive.
    pub fn nan_bits(&self) -> u32 {
        match self.nan {
            NanEncoding::IeeeExponentAllOnes => {
                (self.exponent_all_ones() << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
            }
            NanEncoding::AllOnesPattern => self.sign_mask() - 1,
        }
    }

    /// +inf, when the layout has one.
    pub fn inf_bits(&self) -> Option<u32> {
        self.has_inf
            .then(|| self.exponent_all_ones() << self.mantissa_bits)
    }

    /// Largest finite value.
    pub fn max(&self) -> f64 {
        self.decode(self.max_finite_bits())
    }

    /// Smallest positive normal value, 2^(1-bias).
    pub fn smallest_normal(&self) -> f64 {
        pow2(1 - self.bias())
    }

    /// Smallest positive subnormal value, 2^(1-bias-M).
    pub fn smallest_subnormal(&self) -> f64 {
        pow2(1 - self.bias() - self.mantissa_bits as i32)
    }

    /// Machine epsilon: the gap between 1 and the next value, 2^-M.
    pub fn epsilon(&self) -> f64 {
        pow2(-(self.mantissa_bits as i32))
    }

    /// Significant decimal digits, log10(2^(M+1)) (the hidden bit counts).
    pub fn decimal_digits(&self) -> f64 {
        (self.mantissa_bits + 1) as f64 * std::f64::consts::LOG10_2
    }

    /// Splits a bit pattern into its raw fields.
    pub fn fields(&self, bits: u32) -> Fields {
        Fields {
            sign: (bits >> (self.exponent_bits + self.mantissa_bits)) & 1,
            exponent: (bits >> self.mantissa_bits) & self.exponent_all_ones(),
            mantissa: bits & self.mantissa_mask(),
        }
    }

    /// Which kind of number `bits` holds.
    pub fn classify(&self, bits: u32) -> Class {
        let f = self.fields(bits);
        let top = f.exponent == self.exponent_all_ones();
        match self.nan {
            NanEncoding::IeeeExponentAllOnes if top && f.mantissa == 0 => Class::Infinite,
            NanEncoding::IeeeExponentAllOnes if top => Class::Nan,
            NanEncoding::AllOnesPattern if top && f.mantissa == self.mantissa_mask() => Class::Nan,
            _ if f.exponent == 0 && f.mantissa == 0 => Class::Zero,
            _ if f.exponent == 0 => Class::Subnormal,
            _ => Class::Normal,
        }
    }

    /// The exact value of a bit pattern (every value of these layouts is exact in f64).
    pub fn decode(&self, bits: u32) -> f64 {
        let f = self.fields(bits);
        let sign = if f.sign == 1 { -1.0 } else { 1.0 };
        let m = f.mantissa as f64 / pow2(self.mantissa_bits as i32);
        match self.classify(bits) {
            Class::Nan => f64::NAN,
            Class::Infinite => sign * f64::INFINITY,
            Class::Zero => sign * 0.0,
            Class::Subnormal => sign * pow2(1 - self.bias()) * m,
            Class::Normal => sign * pow2(f.exponent as i32 - self.bias()) * (1.0 + m),
        }
    }

    /// Encodes `x` with round-to-nearest-even; see [`Overflow`] for what happens past the largest
    /// finite value. NaN becomes the canonical quiet NaN with x's sign (e4m3: S.1111.111).
    pub fn encode(&self, x: f64) -> u32 {
        let sign = if x.is_sign_negative() {
            self.sign_mask()
        } else {
            0
        };
        if x.is_nan() {
            return sign | self.nan_bits();
        }
        let magnitude = self.encode_magnitude(x.abs());
        sign | magnitude
    }

    /// `encode` for a non-negative, non-NaN input; returns the bits without the sign.
    fn encode_magnitude(&self, x: f64) -> u32 {
        if x == 0.0 {
            return 0;
        }
        if x.is_infinite() {
            return self.overflowed();
        }
        // x = significand × 2^exp2 exactly, with significand < 2^53.
        let raw = x.to_bits();
        let biased64 = (raw >> 52) as i64;
        let frac = raw & ((1u64 << 52) - 1);
        let (significand, exp2) = if biased64 == 0 {
            (frac, -1074i64)
        } else {
            (frac | (1u64 << 52), biased64 - 1075)
        };
        // floor(log2 x): the position of the significand's top bit.
        let top = exp2 + 63 - significand.leading_zeros() as i64;
        let m = self.mantissa_bits as i64;
        let bias = self.bias() as i64;
        // The quantum (ulp) at x: normals use 2^(top-M), everything below 2^(1-bias) shares the
        // subnormal quantum 2^(1-bias-M).
        let quantum_exp = top.max(1 - bias) - m;
        let q = round_shift_right(significand, quantum_exp - exp2);
        // In the normal range q lies in [2^M, 2^(M+1)]; a carry to 2^(M+1) moves into the next
        // exponent by plain addition, and a subnormal that rounds up to 2^M becomes the smallest
        // normal the same way, so one formula covers both.
        let biased_exp = if top < 1 - bias { 0 } else { top + bias };
        let hidden = if biased_exp == 0 { 0 } else { 1i64 << m };
        let magnitude = (biased_exp << m) + q as i64 - hidden;
        if magnitude > self.max_finite_bits() as i64 {
            return self.overflowed();
        }
        magnitude as u32
    }

    fn overflowed(&self) -> u32 {
        match self.overflow {
            Overflow::Infinity => self
                .inf_bits()
                .expect("a layout that overflows to infinity has one"),
            Overflow::Saturate => self.max_finite_bits(),
        }
    }
}

/// `value / 2^shift` rounded to nearest, ties to even (shift may be ≤ 0: then exact).
fn round_shift_right(value: u64, shift: i64) -> u64 {
    if shift <= 0 {
        // Only reachable for values that overflow any layout here; saturate the shift.
        return value.checked_shl((-shift) as u32).unwrap_or(u64::MAX >> 1);
    }
    if shift >= 64 {
        // value < 2^53, so value / 2^shift < 2^-11: rounds to zero.
        return 0;
    }
    let kept = value >> shift;
    let rest = value & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// 2^n exactly, for the exponents these layouts reach (|n| < 1000).
pub(crate) fn pow2(n: i32) -> f64 {
    2f64.powi(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_follow_from_the_layout() {
        let h = FloatLayout::FP16;
        assert_eq!((h.bits(), h.bias(), h.max()), (16, 15, 65504.0));
        assert_eq!(h.smallest_normal(), 6.103515625e-5);
        assert_eq!(h.smallest_subnormal(), 2f64.powi(-24));
        assert_eq!(FloatLayout::FP8_E4M3.max(), 448.0);
        assert_eq!(FloatLayout::FP8_E5M2.max(), 57344.0);
        assert_eq!(FloatLayout::FP32.max(), f32::MAX as f64);
        assert_eq!(FloatLayout::BF16.max(), 3.3895313892515355e38);
    }

    #[test]
    fn ties_go_to_even() {
        let h = FloatLayout::FP16;
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: the even mantissa (1.0) wins.
        assert_eq!(h.encode(1.0 + 2f64.powi(-11)), 0x3C00);
        // 1 + 3·2^-11 lies halfway between 1+2^-10 (odd) and 1+2^-9 (even).
        assert_eq!(h.encode(1.0 + 3.0 * 2f64.powi(-11)), 0x3C02);
    }
}
