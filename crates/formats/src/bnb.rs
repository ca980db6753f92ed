//! NF4 stored exactly as bitsandbytes stores it (`quantize_4bit(quant_type="nf4")`, QLoRA's base
//! weights): blocks of 64 values, each scaled by its fp32 absmax and rounded to the nearest of the
//! 16 NF4 levels (midpoints computed in f32; a value on a midpoint takes the lower code), two codes
//! per byte with the first in the high nibble. Double quantization (`compress_statistics=True`)
//! stores the absmax values themselves in 8 bits: their mean is subtracted (one fp32 offset), and
//! the rest is quantized in blocks of 256 with bitsandbytes' signed dynamic map (an fp32 absmax per
//! block of 256), which is 4 + 8/64 + 32/(64·256) = 4.127 bits per weight.
//!
//! Written from the format's definition; `tests/golden_nf4.rs` holds it to bitsandbytes' own bytes
//! (`dev/golden_nf4.py`, its CPU backend): the packed codes, the fp32 absmax and the dynamic map
//! are equal to the bit. Two places may differ: the mean of the absmax values in its last bit
//! (frugal sums in f64, torch in f32 in its own order), and an absmax code close to the middle of
//! two map entries (frugal searches the map by the rule of bitsandbytes' CUDA kernel; its CPU
//! kernel's approximate search sometimes returns the entry above: 1 code in 601 in the fixture).
//! Example: `bnb::quantize(&x, 64, true).bits_per_weight()` is about 4.127.

use crate::NF4_LEVELS;

/// bitsandbytes' block of the second-level (absmax) quantization.
pub const NESTED_BLOCK: usize = 256;

/// The absmax of each block, as stored.
#[derive(Clone, Debug, PartialEq)]
pub enum Absmax {
    /// One fp32 per block.
    F32(Vec<f32>),
    /// Double quantization: one code of the dynamic map per block, the fp32 mean subtracted
    /// before, and an fp32 absmax per [`NESTED_BLOCK`] blocks.
    Double {
        codes: Vec<u8>,
        offset: f32,
        absmax2: Vec<f32>,
    },
}

/// A tensor in bitsandbytes' NF4 storage.
#[derive(Clone, Debug, PartialEq)]
pub struct Nf4 {
    /// Two codes per byte, high nibble first; an odd length is padded with the code of 0.
    pub packed: Vec<u8>,
    pub absmax: Absmax,
    pub len: usize,
    pub block: usize,
}

impl Nf4 {
    /// Bytes stored: codes, absmax (and for double quantization the offset and second-level
    /// scales; the 256-entry map is a constant of the format, not counted).
    pub fn stored_bytes(&self) -> usize {
        stored_bytes(
            self.len,
            self.block,
            matches!(self.absmax, Absmax::Double { .. }),
        )
    }

    pub fn bits_per_weight(&self) -> f64 {
        8.0 * self.stored_bytes() as f64 / self.len as f64
    }
}

/// Bytes of `n` values in blocks of `block`, with or without double quantization.
pub fn stored_bytes(n: usize, block: usize, double: bool) -> usize {
    let blocks = n.div_ceil(block);
    let codes = n.div_ceil(2);
    if double {
        codes + blocks + 4 * blocks.div_ceil(NESTED_BLOCK) + 4
    } else {
        codes + 4 * blocks
    }
}

/// torch's float32 `linspace` as its CPU kernel computes it: the first half counted up from
/// `start`, the second down from `end`, each point one fused multiply-add (one rounding).
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - i - 1) as f32, end)
            }
        })
        .collect()
}

/// bitsandbytes' signed 8-bit dynamic map (`create_dynamic_map(signed=True)`): for exponents
/// 10^-6 … 10^0, the means of 2^i + 1 evenly spaced points in [0.1, 1], with both signs, then 0
/// and 1, sorted.
pub fn dynamic_map() -> [f32; 256] {
    let mut data: Vec<f32> = Vec::with_capacity(256);
    for i in 0..7i32 {
        let points = linspace(0.1, 1.0, (1usize << i) + 1);
        let scale = 10f64.powi(i - 6) as f32;
        let means: Vec<f32> = points.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        data.extend(means.iter().map(|m| scale * m));
        data.extend(means.iter().map(|m| -scale * m));
    }
    data.push(0.0);
    data.push(1.0);
    data.sort_by(f32::total_cmp);
    let mut out = [0.0f32; 256];
    out.copy_from_slice(&data);
    out
}

/// The index of the bucket `x` falls in: the number of `bounds` strictly below it
/// (`torch.bucketize`, right=False).
fn bucket(x: f32, bounds: &[f32]) -> usize {
    bounds.partition_point(|&b| b < x)
}

/// bitsandbytes' 8-bit blockwise quantizer's search of a sorted 256-entry map: a seven-step
/// binary search from the middle that remembers the last entry passed above and below, then the
/// nearer of the entry it stopped on and that remembered neighbour, by their midpoint. It is not
/// always the nearest entry of the map (the remembered neighbour need not be adjacent), which is
/// why it is written out instead of a nearest-entry lookup.
fn search_map(map: &[f32; 256], x: f32) -> u8 {
    let (mut pivot, mut upper_pivot, mut lower_pivot) = (127usize, 255usize, 0usize);
    let (mut lower, mut upper) = (-1.0f32, 1.0f32);
    let mut val = map[pivot];
    let mut step = 64;
    while step > 0 {
        if x > val {
            lower_pivot = pivot;
            lower = val;
            pivot += step;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= step;
        }
        val = map[pivot];
        step >>= 1;
    }
    if upper_pivot == 255 {
        upper = map[255];
    }
    if lower_pivot == 0 {
        lower = map[0];
    }
    let code = if x > val {
        if x > (upper + val) * 0.5 {
            upper_pivot
        } else {
            pivot
        }
    } else if x < (lower + val) * 0.5 {
        lower_pivot
    } else {
        pivot
    };
    code as u8
}

/// The absmax values' blockwise 8-bit quantization (`quantize_blockwise`, bitsandbytes' CPU
/// kernel): every block scaled by the reciprocal of its absmax, each value searched in the map.
fn quantize_blockwise(x: &[f32], block: usize, map: &[f32; 256]) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(x.len());
    let mut absmax = Vec::with_capacity(x.len().div_ceil(block));
    for b in x.chunks(block) {
        let am = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inv = 1.0 / am;
        codes.extend(
            b.iter()
                .map(|v| search_map(map, (v * inv).clamp(-1.0, 1.0))),
        );
        absmax.push(am);
    }
    (codes, absmax)
}

/// Blockwise absmax scaling as bitsandbytes does it: full blocks multiply by the reciprocal,
/// the remainder block divides; both clamp to [-1, 1].
fn scaled_blocks(x: &[f32], block: usize) -> (Vec<f32>, Vec<f32>) {
    let full = x.len() - x.len() % block;
    let mut absmax = Vec::with_capacity(x.len().div_ceil(block));
    let mut scaled = Vec::with_capacity(x.len());
    for b in x[..full].chunks_exact(block) {
        let am = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inv = 1.0 / am.max(1e-38);
        scaled.extend(b.iter().map(|v| (v * inv).clamp(-1.0, 1.0)));
        absmax.push(am);
    }
    if full < x.len() {
        let rest = &x[full..];
        let am = rest.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-38);
        scaled.extend(rest.iter().map(|v| (v / am).clamp(-1.0, 1.0)));
        absmax.push(am);
    }
    (scaled, absmax)
}

fn midpoints(levels: &[f32]) -> Vec<f32> {
    levels.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect()
}

/// `x` in NF4 with blocks of `block`, optionally double-quantized. NaN is stored as it would
/// compare (the top code); callers that care reject it first.
pub fn quantize(x: &[f32], block: usize, double: bool) -> Nf4 {
    assert!(block >= 1, "a block holds at least one value");
    let levels: Vec<f32> = NF4_LEVELS.iter().map(|&l| l as f32).collect();
    let bounds = midpoints(&levels);
    let (scaled, absmax) = scaled_blocks(x, block);
    let code = |v: f32| bucket(v, &bounds) as u8;
    let packed = scaled
        .chunks(2)
        .map(|pair| (code(pair[0]) << 4) | pair.get(1).map_or(code(0.0), |&v| code(v)))
        .collect();
    let absmax = if double {
        double_quantize(&absmax)
    } else {
        Absmax::F32(absmax)
    };
    Nf4 {
        packed,
        absmax,
        len: x.len(),
        block,
    }
}

/// The second-level quantization of a tensor's fp32 `absmax` values (`compress_statistics`):
/// their mean subtracted, the rest in blocks of 256 with the signed dynamic map.
pub fn double_quantize(absmax: &[f32]) -> Absmax {
    // The mean in f64, rounded once (torch sums in f32 in its own order: see the module).
    let offset = (absmax.iter().map(|&a| f64::from(a)).sum::<f64>() / absmax.len() as f64) as f32;
    let centred: Vec<f32> = absmax.iter().map(|a| a - offset).collect();
    let (codes, absmax2) = quantize_blockwise(&centred, NESTED_BLOCK, &dynamic_map());
    Absmax::Double {
        codes,
        offset,
        absmax2,
    }
}

/// The values `q` stands for (bitsandbytes' `dequantize_4bit`).
pub fn dequantize(q: &Nf4) -> Vec<f32> {
    let absmax: Vec<f32> = match &q.absmax {
        Absmax::F32(a) => a.clone(),
        Absmax::Double {
            codes,
            offset,
            absmax2,
        } => {
            let map = dynamic_map();
            codes
                .iter()
                .enumerate()
                .map(|(i, &c)| map[c as usize] * absmax2[i / NESTED_BLOCK] + offset)
                .collect()
        }
    };
    (0..q.len)
        .map(|i| {
            let byte = q.packed[i / 2];
            let c = if i % 2 == 0 { byte >> 4 } else { byte & 0xF };
            NF4_LEVELS[c as usize] as f32 * absmax[i / q.block]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dynamic_map_is_sorted_and_spans_minus_one_to_one() {
        let m = dynamic_map();
        assert!(m.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!((m[0], m[255]), (-0.99296874, 1.0));
        assert!(m.contains(&0.0));
    }

    #[test]
    fn double_quantization_is_4_127_bits_per_weight() {
        let x: Vec<f32> = (0..64 * 256 * 4)
            .map(|i| ((i * 7919) % 1000) as f32 - 500.0)
            .collect();
        let q = quantize(&x, 64, true);
        assert!(
            (q.bits_per_weight() - 4.127).abs() < 1e-3,
            "{}",
            q.bits_per_weight()
        );
        assert_eq!(quantize(&x, 64, false).bits_per_weight(), 4.5);
        let back = dequantize(&q);
        let scale = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 0.2 * scale, "{worst}");
    }
}
