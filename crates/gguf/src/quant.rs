//! ggml's tensor types and their reference dequantization: each block's scale (and minimum)
//! times its integer codes, in the order ggml's `dequantize_row_*` and the `gguf` Python
//! package's dequantizers compute them, so the f32 values are theirs bit for bit (tested against
//! the Python package on golden blocks: `crates/gguf/tests/golden.rs`).
//!
//! Read: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the k-quants Q4_K, Q5_K, Q6_K (what
//! Q4_K_M and Q5_K_M files hold). Any other type is refused by name.

use half::f16;

/// A tensor's storage type (ggml's `ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

/// Values per k-quant super-block.
const QK_K: usize = 256;

impl TensorType {
    /// The type of ggml's code, or what to say about one this reader does not know.
    pub fn from_code(code: u32) -> Result<TensorType, String> {
        Ok(match code {
            0 => TensorType::F32,
            1 => TensorType::F16,
            2 => TensorType::Q4_0,
            3 => TensorType::Q4_1,
            6 => TensorType::Q5_0,
            7 => TensorType::Q5_1,
            8 => TensorType::Q8_0,
            12 => TensorType::Q4K,
            13 => TensorType::Q5K,
            14 => TensorType::Q6K,
            30 => TensorType::BF16,
            other => {
                let name = match other {
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    15 => "Q8_K",
                    16..=23 | 29 => "an IQ type",
                    _ => "an unknown type",
                };
                return Err(format!(
                    "ggml type {other} ({name}) is not read; F32, F16, BF16, Q4_0, Q4_1, Q5_0, \
                     Q5_1, Q8_0, Q4_K, Q5_K and Q6_K are"
                ));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "F32",
            TensorType::F16 => "F16",
            TensorType::BF16 => "BF16",
            TensorType::Q4_0 => "Q4_0",
            TensorType::Q4_1 => "Q4_1",
            TensorType::Q5_0 => "Q5_0",
            TensorType::Q5_1 => "Q5_1",
            TensorType::Q8_0 => "Q8_0",
            TensorType::Q4K => "Q4_K",
            TensorType::Q5K => "Q5_K",
            TensorType::Q6K => "Q6_K",
        }
    }

    /// Values per block.
    pub fn block_len(self) -> u64 {
        match self {
            TensorType::F32 | TensorType::F16 | TensorType::BF16 => 1,
            TensorType::Q4K | TensorType::Q5K | TensorType::Q6K => QK_K as u64,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            TensorType::F32 => 4,
            TensorType::F16 | TensorType::BF16 => 2,
            TensorType::Q4_0 => 18,
            TensorType::Q4_1 => 20,
            TensorType::Q5_0 => 22,
            TensorType::Q5_1 => 24,
            TensorType::Q8_0 => 34,
            TensorType::Q4K => 144,
            TensorType::Q5K => 176,
            TensorType::Q6K => 210,
        }
    }

    /// Bytes of a row of `n` values (`n` a multiple of the block length).
    pub fn row_bytes(self, n: u64) -> u64 {
        n / self.block_len() * self.block_bytes()
    }
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Where a block's decoder puts value `j`: `scale · code`, plus `min` for the types that have
/// one (ggml's `d · q + m`; a k-quant's `d1 · q − m1` is `d1 · q + (−m1)`, the same float).
trait Put {
    fn put(&mut self, j: usize, scale: f32, code: i8, min: Option<f32>);
}

/// Values, as ggml's reference dequantizers compute them.
struct Values<'a>(&'a mut [f32]);

impl Put for Values<'_> {
    #[inline(always)]
    fn put(&mut self, j: usize, scale: f32, code: i8, min: Option<f32>) {
        let w = scale * f32::from(code);
        self.0[j] = min.map_or(w, |m| w + m);
    }
}

/// A tensor's quantized values as int8 codes with an f32 scale and minimum per group of
/// `group` along the flat order: `scale · code + min` is ggml's value bit for bit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grouped {
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    /// Zero for the types without a minimum.
    pub mins: Vec<f32>,
    pub group: usize,
}

struct Groups<'a> {
    g: &'a mut Grouped,
    /// The block's first value in the flat order.
    at: usize,
}

impl Put for Groups<'_> {
    #[inline(always)]
    fn put(&mut self, j: usize, scale: f32, code: i8, min: Option<f32>) {
        let idx = self.at + j;
        let g = idx / self.g.group;
        self.g.codes[idx] = code;
        self.g.scales[g] = scale;
        self.g.mins[g] = min.unwrap_or(0.0);
    }
}

impl TensorType {
    /// The values that share one scale: 32, 16 for Q6_K; `None` for the float types.
    pub fn scale_group(self) -> Option<usize> {
        match self {
            TensorType::F32 | TensorType::F16 | TensorType::BF16 => None,
            TensorType::Q6K => Some(16),
            _ => Some(32),
        }
    }

    /// Whether the type's codes are 4 bits (Q4_0's −8..7 shift to 0..15 into a minimum).
    pub fn four_bit(self) -> bool {
        matches!(self, TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q4K)
    }

    /// Whether a group's values carry a minimum (`d · q + m`).
    pub fn has_min(self) -> bool {
        matches!(
            self,
            TensorType::Q4_1 | TensorType::Q5_1 | TensorType::Q4K | TensorType::Q5K
        )
    }
}

fn check_len(kind: TensorType, data: &[u8], n: usize) -> Result<(), String> {
    let (len, bytes) = (kind.block_len() as usize, kind.block_bytes() as usize);
    if n % len != 0 || data.len() != n / len * bytes {
        return Err(format!(
            "{} bytes of {} do not hold {} values",
            data.len(),
            kind.name(),
            n
        ));
    }
    Ok(())
}

/// Dequantizes `data` (whole blocks of `kind`) into `out`; an error says what does not add up.
pub fn dequantize(kind: TensorType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    check_len(kind, data, out.len())?;
    let (len, bytes) = (kind.block_len() as usize, kind.block_bytes() as usize);
    for (b, y) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(len)) {
        match kind {
            TensorType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            TensorType::F16 => y[0] = half(b, 0),
            TensorType::BF16 => {
                y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
            }
            _ => block(kind, b, &mut Values(y)),
        }
    }
    Ok(())
}

/// `n` values of a quantized `kind` as int8 codes in groups of `group` (16 or 32, no larger
/// than the type's own: a group of 16 repeats a 32-value group's scale and minimum).
pub fn grouped(kind: TensorType, data: &[u8], n: usize, group: usize) -> Result<Grouped, String> {
    check_len(kind, data, n)?;
    match kind.scale_group() {
        Some(own) if own % group == 0 && (group == 16 || group == 32) => {}
        _ => {
            return Err(format!(
                "{} values are not held as int8 codes in groups of {group}",
                kind.name()
            ))
        }
    }
    let mut g = Grouped {
        codes: vec![0; n],
        scales: vec![0.0; n / group],
        mins: vec![0.0; n / group],
        group,
    };
    let (len, bytes) = (kind.block_len() as usize, kind.block_bytes() as usize);
    for (i, b) in data.chunks_exact(bytes).enumerate() {
        // Each value sets its group's scale: a group of 16 inside a 32-value one takes its.
        block(
            kind,
            b,
            &mut Groups {
                g: &mut g,
                at: i * len,
            },
        );
    }
    Ok(g)
}

/// One block of a quantized type into `y`.
fn block(kind: TensorType, b: &[u8], y: &mut impl Put) {
    match kind {
        TensorType::Q4_0 => q4_0(b, y),
        TensorType::Q4_1 => q4_1(b, y),
        TensorType::Q5_0 => q5(b, y, false),
        TensorType::Q5_1 => q5(b, y, true),
        TensorType::Q8_0 => {
            let d = half(b, 0);
            for (j, &q) in b[2..34].iter().enumerate() {
                y.put(j, d, q as i8, None);
            }
        }
        TensorType::Q4K => q4_k(b, y),
        TensorType::Q5K => q5_k(b, y),
        TensorType::Q6K => q6_k(b, y),
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => {
            unreachable!("float types are not blocks of codes")
        }
    }
}

/// `d`, then 16 bytes: the low nibbles are values 0-15, the high ones 16-31, each minus 8.
fn q4_0(b: &[u8], y: &mut impl Put) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y.put(j, d, (q & 0xF) as i8 - 8, None);
        y.put(j + 16, d, (q >> 4) as i8 - 8, None);
    }
}

/// `d`, `m`, then 16 bytes of nibbles as in Q4_0, unsigned: `d · q + m`.
fn q4_1(b: &[u8], y: &mut impl Put) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y.put(j, d, (q & 0xF) as i8, Some(m));
        y.put(j + 16, d, (q >> 4) as i8, Some(m));
    }
}

/// Q5_0 (`d`, 32 high bits, nibbles; minus 16) and Q5_1 (`d`, `m`, high bits, nibbles; plus m).
fn q5(b: &[u8], y: &mut impl Put, with_min: bool) {
    let d = half(b, 0);
    let (m, at) = if with_min {
        (Some(half(b, 2)), 4)
    } else {
        (None, 2)
    };
    let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let off = if with_min { 0 } else { 16 };
    for (j, &q) in b[at + 4..at + 20].iter().enumerate() {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        let (x0, x1) = ((q & 0xF) | h0, (q >> 4) | h1);
        y.put(j, d, x0 as i8 - off, m);
        y.put(j + 16, d, x1 as i8 - off, m);
    }
}

/// The 6-bit scale and minimum of sub-block `j` from a k-quant's 12 packed bytes.
fn scale_min(j: usize, q: &[u8]) -> (f32, f32) {
    let (s, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (f32::from(s), f32::from(m))
}

/// Q4_K: `d`, `dmin`, 12 bytes of 6-bit scales and minimums for 8 sub-blocks of 32, 128 bytes of
/// nibbles (64 values per 32 bytes: low nibbles first).
fn q4_k(b: &[u8], y: &mut impl Put) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (k, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min(2 * k, scales);
        let (s2, m2) = scale_min(2 * k + 1, scales);
        let (d1, m1, d2, m2) = (d * s1, -(dmin * m1), d * s2, -(dmin * m2));
        for (l, &q) in q.iter().enumerate() {
            y.put(64 * k + l, d1, (q & 0xF) as i8, Some(m1));
            y.put(64 * k + l + 32, d2, (q >> 4) as i8, Some(m2));
        }
    }
}

/// Q5_K: Q4_K's layout with 32 bytes of fifth bits after the scales.
fn q5_k(b: &[u8], y: &mut impl Put) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (k, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min(2 * k, scales);
        let (s2, m2) = scale_min(2 * k + 1, scales);
        let (d1, m1, d2, m2) = (d * s1, -(dmin * m1), d * s2, -(dmin * m2));
        let (u1, u2) = (1u8 << (2 * k), 2u8 << (2 * k));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y.put(64 * k + l, d1, ((q[l] & 0xF) + h1) as i8, Some(m1));
            y.put(64 * k + l + 32, d2, ((q[l] >> 4) + h2) as i8, Some(m2));
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16 values),
/// then `d`; values are signed 6-bit codes minus 32.
fn q6_k(b: &[u8], y: &mut impl Put) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let code = |low: u8, shift: u32| ((low | (((qh[l] >> shift) & 3) << 4)) as i8) - 32;
            let s = |i: usize| d * f32::from(sc[is + i] as i8);
            let at = 128 * n + l;
            y.put(at, s(0), code(ql[l] & 0xF, 0), None);
            y.put(at + 32, s(2), code(ql[l + 32] & 0xF, 2), None);
            y.put(at + 64, s(4), code(ql[l] >> 4, 4), None);
            y.put(at + 96, s(6), code(ql[l + 32] >> 4, 6), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_ragged_buffer_is_an_error() {
        let mut out = vec![0.0; 32];
        assert!(dequantize(TensorType::Q4_0, &[0; 17], &mut out).is_err());
        let mut odd = vec![0.0; 31];
        assert!(dequantize(TensorType::Q4_0, &[0; 18], &mut odd).is_err());
    }

    #[test]
    fn q4_0_codes_are_nibbles_minus_8() {
        let mut block = vec![0u8; 18];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2] = 0xF0; // value 0: 0 - 8; value 16: 15 - 8
        let mut y = vec![0.0; 32];
        dequantize(TensorType::Q4_0, &block, &mut y).unwrap();
        assert_eq!((y[0], y[16], y[1]), (-4.0, 3.5, -4.0));
    }
}
