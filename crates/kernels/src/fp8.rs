//! fp8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
//! 0x7F/0xFF NaN, largest finite 448) for the KV cache: encoding with round to nearest even and
//! saturation at ±448 (a scaled cache value never exceeds it; NaN encodes as NaN), decoding by a
//! 256-entry table built at compile time. The `formats` crate holds the general codec; this is
//! the hot-path one, checked against it in the tests.
//!
//! ```
//! use kernels::fp8::{e4m3_from_f32, E4M3};
//! assert_eq!(E4M3[e4m3_from_f32(1.0) as usize], 1.0);
//! assert_eq!(E4M3[e4m3_from_f32(1000.0) as usize], 448.0);
//! assert_eq!(E4M3[e4m3_from_f32(0.3) as usize], 0.3125);
//! ```

/// The value of every code.
pub static E4M3: [f32; 256] = table();

const fn value(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f32;
    if e == 15 && code & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m / 8.0 * (1.0 / 64.0)
    } else {
        let mut p = 1.0f32;
        let mut i = 0;
        while i < (e - 7).abs() {
            p *= 2.0;
            i += 1;
        }
        let p = if e >= 7 { p } else { 1.0 / p };
        (1.0 + m / 8.0) * p
    };
    sign * mag
}

const fn table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = value(i as u8);
        i += 1;
    }
    t
}

/// The nearest e4m3 code to `x` (ties to even), saturating at ±448.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(448.0);
    let code = if a < 1.0 / 64.0 {
        // Subnormals (and the first normal): multiples of 2^-9.
        (a * 512.0).round_ties_even() as u8
    } else {
        let bits = a.to_bits();
        // Round the f32 mantissa to 3 bits, to nearest even; a carry bumps the exponent.
        let round = 0x7_FFFF + ((bits >> 20) & 1);
        let r = (bits + round) >> 20;
        (r - ((127 - 7) << 3)) as u8
    };
    sign | code.min(0x7E)
}
