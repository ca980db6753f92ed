//! Frozen LoRA bases: one HF linear's stored bytes dequantized to f32 rows, for the GEMM that
//! reads it (the forward, and again the backward's input gradient; no dequantized copy is kept).
//!
//! Stored layouts (little-endian, what the engine's packer writes):
//! - [`Stored::Bf16`]: the values as bf16.
//! - [`Stored::Int8`]: one signed code per weight, then one f32 scale per row: w = scale × code.
//! - [`Stored::Nf4`]: bitsandbytes' `quantize_4bit(quant_type="nf4")`: two codes per byte, the
//!   first value in the high nibble; one f32 absmax per block of `block` values, or with double
//!   quantization one u8 code per block into the signed dynamic map, one f32 scale per 256 blocks
//!   and one f32 offset: absmax = map[code] × scale + offset; w = level[code] × absmax.
//!
//! - [`Stored::Grouped`]: a GGUF file's blocks as inference's `ggml` weights hold them (see
//!   `grouped`).
//!
//! Work splits over rayon by runs of whole blocks; NF4 decodes 16 values per AVX-512 `vpermps`
//! when the CPU has it (chosen at run time); [`reference`] decodes value by value.
//!
//! ```
//! use linalg::dequant::{dequantize, Stored};
//! let levels = [0.0f32; 16];
//! let map = [0.0f32; 256];
//! let mut out = [0.0f32; 2];
//! let src = [1i8 as u8, (-2i8) as u8, 0, 0, 0, 64]; // codes 1, -2; scale 2.0 (f32 LE)
//! dequantize(&mut out, &src, Stored::Int8 { rows: 1 }, &levels, &map);
//! assert_eq!(out, [2.0, -4.0]);
//! ```

use rayon::prelude::*;

mod grouped;

/// bitsandbytes' blocks of absmax values per second-level scale (double quantization).
pub const NESTED_BLOCK: usize = 256;

/// Values per rayon task (a multiple of every block size used).
const TASK: usize = 1 << 14;

/// How one part's bytes are laid out (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Bf16,
    Int8 {
        rows: usize,
    },
    Nf4 {
        block: usize,
        double: bool,
    },
    /// Codes (two a byte with `nibbles`), an f32 scale and an f32 minimum per `group`.
    Grouped {
        group: usize,
        nibbles: bool,
    },
}

impl Stored {
    /// Bytes of `n` values stored this way (before the 4-byte padding).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            Stored::Bf16 => 2 * n,
            Stored::Int8 { rows } => n + 4 * rows,
            Stored::Nf4 { block, double } => {
                let blocks = n.div_ceil(block);
                let codes = n.div_ceil(2);
                match double {
                    true => codes + blocks + 4 * blocks.div_ceil(NESTED_BLOCK) + 4,
                    false => codes + 4 * blocks,
                }
            }
            Stored::Grouped { group, nibbles } => grouped::bytes(n, group, nibbles),
        }
    }
}

fn f32_at(src: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(src[4 * i..4 * i + 4].try_into().expect("four bytes"))
}

/// The 16 NF4 levels and bitsandbytes' signed dynamic map.
pub type Tables<'a> = (&'a [f32; 16], &'a [f32; 256]);

/// `out` (all of the part's values) from `src` stored as `stored`; `levels` are the 16 NF4
/// levels and `map` bitsandbytes' signed dynamic map (read only by the formats that use them).
pub fn dequantize(
    out: &mut [f32],
    src: &[u8],
    stored: Stored,
    levels: &[f32; 16],
    map: &[f32; 256],
) {
    dequantize_range(out, src, stored, out.len(), 0, levels, map);
}

/// Values `first .. first + out.len()` of a part of `n` values (a tile of rows: the GEMM that
/// reads it then finds it in cache). Runs of whole NF4 blocks take the fast path; a range that
/// starts inside a block (rows narrower than a block, toy models) is decoded value by value.
pub fn dequantize_range(
    out: &mut [f32],
    src: &[u8],
    stored: Stored,
    n: usize,
    first: usize,
    levels: &[f32; 16],
    map: &[f32; 256],
) {
    assert!(first + out.len() <= n, "values {first}.. of {n}");
    assert!(
        src.len() >= stored.bytes(n),
        "{} bytes for {n} values",
        src.len()
    );
    if let Stored::Grouped { group, nibbles } = stored {
        return grouped::range(out, src, n, first, group, nibbles);
    }
    if first == 0 && out.len() == n {
        return whole(out, src, stored, levels, map);
    }
    match stored {
        Stored::Bf16 => whole(out, &src[2 * first..], Stored::Bf16, levels, map),
        Stored::Int8 { rows } => {
            let cols = n / rows;
            let (codes, scales) = (&src[first..], &src[n..]);
            out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
                for (j, x) in o.iter_mut().enumerate() {
                    let i = t * TASK + j;
                    *x = f32_at(scales, (first + i) / cols) * f32::from(codes[i] as i8);
                }
            });
        }
        Stored::Nf4 { block, double } if first.is_multiple_of(block) => {
            let blocks = n.div_ceil(block);
            let rest = &src[n.div_ceil(2)..];
            let b0 = first / block;
            out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
                for (k, ob) in o.chunks_mut(block).enumerate() {
                    let b = b0 + t * TASK / block + k;
                    let a = nf4_absmax(rest, blocks, b, double, map);
                    let lut: [f32; 16] = std::array::from_fn(|i| levels[i] * a);
                    nf4_block(ob, &src[b * block / 2..], &lut);
                }
            });
        }
        Stored::Grouped { .. } => unreachable!("decoded above"),
        Stored::Nf4 { .. } => {
            let mut all = vec![0.0f32; n];
            reference::dequantize(&mut all, src, stored, (levels, map));
            out.copy_from_slice(&all[first..first + out.len()]);
        }
    }
}

/// Block `b`'s absmax (of `blocks`), stored as f32 or double-quantized.
#[inline]
fn nf4_absmax(rest: &[u8], blocks: usize, b: usize, double: bool, map: &[f32; 256]) -> f32 {
    match double {
        false => f32_at(rest, b),
        true => {
            let scales = &rest[blocks..];
            let offset = f32_at(scales, blocks.div_ceil(NESTED_BLOCK));
            map[rest[b] as usize] * f32_at(scales, b / NESTED_BLOCK) + offset
        }
    }
}

/// A whole part (or, for bf16, a run of values from its first).
fn whole(out: &mut [f32], src: &[u8], stored: Stored, levels: &[f32; 16], map: &[f32; 256]) {
    let n = out.len();
    match stored {
        Stored::Grouped { group, nibbles } => grouped::range(out, src, n, 0, group, nibbles),
        Stored::Bf16 => out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
            let s = &src[2 * t * TASK..];
            for (j, x) in o.iter_mut().enumerate() {
                let bits = u16::from_le_bytes([s[2 * j], s[2 * j + 1]]);
                *x = f32::from_bits(u32::from(bits) << 16);
            }
        }),
        Stored::Int8 { rows } => {
            let cols = n / rows;
            assert_eq!(cols * rows, n, "whole rows");
            let scales = &src[n..];
            out.par_chunks_mut(cols).enumerate().for_each(|(r, o)| {
                let scale = f32_at(scales, r);
                for (x, &c) in o.iter_mut().zip(&src[r * cols..(r + 1) * cols]) {
                    *x = scale * f32::from(c as i8);
                }
            });
        }
        Stored::Nf4 { block, double } => {
            assert!(
                block.is_multiple_of(2) && TASK.is_multiple_of(block),
                "block {block}"
            );
            let blocks = n.div_ceil(block);
            let packed = &src[..n.div_ceil(2)];
            let rest = &src[n.div_ceil(2)..];
            let absmax = |b: usize| nf4_absmax(rest, blocks, b, double, map);
            out.par_chunks_mut(TASK).enumerate().for_each(|(t, o)| {
                for (k, ob) in o.chunks_mut(block).enumerate() {
                    let b = t * TASK / block + k;
                    let a = absmax(b);
                    let lut: [f32; 16] = std::array::from_fn(|i| levels[i] * a);
                    let bytes = &packed[b * block / 2..];
                    nf4_block(ob, bytes, &lut);
                }
            });
        }
    }
}

/// One block: value 2j from byte j's high nibble, 2j + 1 from its low nibble. Runs of 16 values
/// take AVX-512, or runs of 8 AVX2, when [`crate::cpu::level`] allows it.
#[inline]
fn nf4_block(out: &mut [f32], bytes: &[u8], lut: &[f32; 16]) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::{level, Level};
        type Runs = unsafe fn(&mut [f32], &[u8], &[f32; 16]);
        let simd: Option<(usize, Runs)> = match level() {
            l if l >= Level::Avx512 => Some((16, avx512::nf4_runs)),
            Level::Avx2 | Level::Avx2Vnni => Some((8, avx2::nf4_runs)),
            _ => None,
        };
        if let Some((step, runs)) = simd {
            let whole = out.len() / step * step;
            // SAFETY: the level says the CPU has the path's features; the loop reads whole / 2
            // bytes and writes whole values, both inside the slices.
            unsafe { runs(&mut out[..whole], &bytes[..whole / 2], lut) };
            return nf4_scalar(&mut out[whole..], &bytes[whole / 2..], lut);
        }
    }
    nf4_scalar(out, bytes, lut)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `out.len()` (a multiple of 8) values from `out.len() / 2` bytes: each nibble picks from
    /// the two 8-entry halves of `lut` (`vpermps` each) and bit 3 blends them.
    #[target_feature(enable = "avx2")]
    pub unsafe fn nf4_runs(out: &mut [f32], bytes: &[u8], lut: &[f32; 16]) {
        let (low, high) = (
            _mm256_loadu_ps(lut.as_ptr()),
            _mm256_loadu_ps(lut[8..].as_ptr()),
        );
        // Even lanes take the high nibble, odd lanes the low one.
        let shifts = _mm256_set_epi32(0, 4, 0, 4, 0, 4, 0, 4);
        let low4 = _mm256_set1_epi32(0xF);
        for (o, b) in out.chunks_exact_mut(8).zip(bytes.chunks_exact(4)) {
            let four = _mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            let pairs = _mm_unpacklo_epi8(four, four);
            let idx =
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(pairs), shifts), low4);
            let (l, h) = (
                _mm256_permutevar8x32_ps(low, idx),
                _mm256_permutevar8x32_ps(high, idx),
            );
            // Bit 3 moved to the sign bit selects the high half.
            let pick = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
            _mm256_storeu_ps(o.as_mut_ptr(), _mm256_blendv_ps(l, h, pick));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `out.len()` (a multiple of 16) values from `out.len() / 2` bytes: each byte's pair of
    /// nibbles, high first, looked up in the 16-entry `lut` by one `vpermps` per 16 values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn nf4_runs(out: &mut [f32], bytes: &[u8], lut: &[f32; 16]) {
        let table = _mm512_loadu_ps(lut.as_ptr());
        // Even lanes take the high nibble, odd lanes the low one.
        let shifts = _mm512_set_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        let low4 = _mm512_set1_epi32(0xF);
        for (o, b) in out.chunks_exact_mut(16).zip(bytes.chunks_exact(8)) {
            let eight = _mm_loadl_epi64(b.as_ptr() as *const __m128i);
            let pairs = _mm_unpacklo_epi8(eight, eight);
            let idx =
                _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(pairs), shifts), low4);
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_permutexvar_ps(idx, table));
        }
    }
}

/// [`nf4_block`] one byte at a time.
fn nf4_scalar(out: &mut [f32], bytes: &[u8], lut: &[f32; 16]) {
    let half = out.len() / 2;
    let mut pairs = out.chunks_exact_mut(2);
    for (pair, &byte) in (&mut pairs).zip(bytes) {
        pair[0] = lut[(byte >> 4) as usize];
        pair[1] = lut[(byte & 0xF) as usize];
    }
    if let [last] = pairs.into_remainder() {
        *last = lut[(bytes[half] >> 4) as usize];
    }
}

/// Value by value, straight from the layout.
pub mod reference {
    use super::{f32_at, Stored, Tables, NESTED_BLOCK};

    /// [`super::dequantize`] element by element; `tables`: the NF4 levels and the dynamic map.
    pub fn dequantize(out: &mut [f32], src: &[u8], stored: Stored, tables: Tables<'_>) {
        let (levels, map) = tables;
        let n = out.len();
        for (i, x) in out.iter_mut().enumerate() {
            *x = match stored {
                Stored::Bf16 => f32::from_bits(
                    u32::from(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])) << 16,
                ),
                Stored::Int8 { rows } => {
                    let cols = n / rows;
                    f32_at(&src[n..], i / cols) * f32::from(src[i] as i8)
                }
                Stored::Nf4 { block, double } => {
                    let blocks = n.div_ceil(block);
                    let rest = &src[n.div_ceil(2)..];
                    let b = i / block;
                    let absmax = if double {
                        let scales = &rest[blocks..];
                        let offset = f32_at(scales, blocks.div_ceil(NESTED_BLOCK));
                        map[rest[b] as usize] * f32_at(scales, b / NESTED_BLOCK) + offset
                    } else {
                        f32_at(rest, b)
                    };
                    let byte = src[i / 2];
                    let code = if i % 2 == 0 { byte >> 4 } else { byte & 0xF };
                    levels[code as usize] * absmax
                }
                Stored::Grouped { group, nibbles } => {
                    super::grouped::value(src, n, i, group, nibbles)
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rng::SplitMix64;

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| (r.next_u64() >> 56) as u8).collect()
    }

    #[test]
    fn every_layout_matches_the_reference_across_task_boundaries() {
        let levels: [f32; 16] = std::array::from_fn(|i| i as f32 / 7.5 - 1.0);
        let map: [f32; 256] = std::array::from_fn(|i| (i as f32 - 128.0) / 128.0);
        let n = 3 * TASK + 64 * 5; // several tasks and a short last one
        for stored in [
            Stored::Bf16,
            Stored::Int8 { rows: n / 64 },
            Stored::Nf4 {
                block: 64,
                double: false,
            },
            Stored::Nf4 {
                block: 64,
                double: true,
            },
        ] {
            let mut src = random_bytes(stored.bytes(n), 7);
            // Finite scales: overwrite the f32 regions with small values.
            let fix = |src: &mut Vec<u8>, from: usize, count: usize| {
                for k in 0..count {
                    let v = 0.01 * (k % 13) as f32 + 0.5;
                    src[from + 4 * k..from + 4 * k + 4].copy_from_slice(&v.to_le_bytes());
                }
            };
            match stored {
                Stored::Bf16 => src.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0x3F),
                Stored::Int8 { rows } => fix(&mut src, n, rows),
                Stored::Nf4 { double: false, .. } => fix(&mut src, n / 2, n / 64),
                Stored::Nf4 { double: true, .. } => {
                    let blocks = n / 64;
                    fix(&mut src, n / 2 + blocks, blocks.div_ceil(NESTED_BLOCK) + 1)
                }
                Stored::Grouped { .. } => unreachable!("tested below"),
            }
            let (mut fast, mut slow) = (vec![0.0; n], vec![1.0; n]);
            dequantize(&mut fast, &src, stored, &levels, &map);
            reference::dequantize(&mut slow, &src, stored, (&levels, &map));
            assert_eq!(fast, slow, "{stored:?}");
            // Tiles of rows, block-aligned or not (rows of 64; a range from inside a block).
            for (first, len) in [
                (64 * 7, 64 * 300),
                (TASK, TASK + 64),
                (32, 96),
                (n - 64, 64),
            ] {
                let mut tile = vec![0.0; len];
                dequantize_range(&mut tile, &src, stored, n, first, &levels, &map);
                assert_eq!(tile, slow[first..first + len], "{stored:?} {first}+{len}");
            }
        }
    }

    #[test]
    fn grouped_blocks_give_inferences_ggml_values_bit_for_bit() {
        use crate::qmatmul::{pack_nibbles, QWeight};
        let mut r = SplitMix64::new(3);
        let mut unit = || (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let (rows, cols) = (40, 96);
        let n = rows * cols;
        for (group, nibbles) in [(32, true), (32, false), (16, false), (16, true)] {
            let codes: Vec<u8> = (0..n)
                .map(|i| match nibbles {
                    true => (i * 7 % 16) as u8,
                    false => (i * 37 % 256) as u8,
                })
                .collect();
            let scales: Vec<f32> = (0..n / group).map(|_| unit() * 0.1).collect();
            let mins: Vec<f32> = (0..n / group).map(|_| unit() - 0.5).collect();
            let mut src = match nibbles {
                true => pack_nibbles(&codes),
                false => codes.clone(),
            };
            src.extend(scales.iter().chain(&mins).flat_map(|x| x.to_le_bytes()));
            let stored = Stored::Grouped { group, nibbles };
            assert_eq!(src.len(), stored.bytes(n));
            let signed: Vec<i8> = codes.iter().map(|&c| c as i8).collect();
            let w = match nibbles {
                true => QWeight::Grouped4 {
                    codes: &src[..n / 2],
                    scales: &scales,
                    mins: Some(&mins),
                    group,
                },
                false => QWeight::Grouped {
                    codes: &signed,
                    scales: &scales,
                    mins: Some(&mins),
                    group,
                },
            };
            let want: Vec<u32> = (0..n)
                .map(|i| w.at(i / cols, i % cols, cols).to_bits())
                .collect();
            let (levels, map) = ([0.0f32; 16], [0.0f32; 256]);
            let mut all = vec![0.0f32; n];
            dequantize(&mut all, &src, stored, &levels, &map);
            assert_eq!(all.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            // A tile of rows 7..30 (whole sub-blocks of 32), and a range that starts inside one.
            let mut tile = vec![0.0f32; 23 * cols];
            dequantize_range(&mut tile, &src, stored, n, 7 * cols, &levels, &map);
            assert_eq!(tile, all[7 * cols..30 * cols]);
            let mut odd = vec![0.0f32; 45];
            dequantize_range(&mut odd, &src, stored, n, 5, &levels, &map);
            assert_eq!(odd, all[5..50]);
        }
    }
}
