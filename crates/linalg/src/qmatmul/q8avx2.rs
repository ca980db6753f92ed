//! The AVX2 integer path for int4, int8 and nf4 weights (llama.cpp's AVX2 approach): each
//! activation row is quantized once per call to int8 in blocks of 32 (scale absmax/127, round to
//! nearest even — the VNNI path's rule, so both see the same activations), then `vpmaddubsw`
//! multiplies 32 unsigned weight bytes by 32 signed activation bytes into 16 pair sums, `vpmaddwd`
//! by ones adds those into 8 int32 lanes, and one FMA scales the block by weight scale × activation
//! scale: 32 weights in 4 instructions per activation row, against 8 FMAs and the widening on the
//! f32 path. With AVX-VNNI (VEX) or AVX-512 VNNI (EVEX) one `vpdpbusd` forms the same int32 sums
//! ([`Dot`]).
//!
//! - int4: the 16 bytes of a 32-weight sub-block give 16 low and 16 high nibbles, which are the
//!   sub-block's weights 0..16 and 16..32 in order (the stored nibble order); the codes are
//!   0..15 and the zero point's share, Σ_g scale_g · zero_g · Σ_{blocks of g} d_a Σ q_a, is
//!   subtracted once per output (as `vnni`).
//! - int4 in tiles of eight output rows ([`tiled`]): the eight outputs in the lanes of one sum,
//!   so the block's convert, scale and multiply-add serve all eight; at the AVX-512 levels two
//!   tiles in one 512-bit sum ([`tiled512`]), the same bits.
//! - int8: signed codes, so `vpsignb` moves each weight's sign onto its activation (|w| stays
//!   unsigned); one scale per output row. In tiles of eight output rows ([`tiled8`]), eight
//!   outputs a sum (sixteen in 512 bits), and with VNNI the weights offset to unsigned instead.
//! - nf4: the codes unpack as int4's, then `vpshufb` looks each up in the 16 levels held as
//!   signed bytes ([`lut4`]), and the block multiplies as int8's; the table's unit joins each
//!   group's scale. Pairs of blocks share one load where [`quantize::paired`] holds, as int4's;
//!   in int4's tiles ([`tiled_nf4`]) the looked-up block multiplies as int8's tiles.
//! - grouped int8 (ggml's blocks repacked): as int8, with a scale per group of 32 (or 16: the
//!   block's low and high 4 lanes take their own) applied to each block's sum, and each group's
//!   minimum times the activations' sum over the group added once per output. Codes 0..15
//!   packed two per byte unpack to the same 32 lanes and multiply unsigned, as int4's: the
//!   same integer sums, so the same results as their int8 copy. In groups of 32 (ggml's Q4_0 …
//!   Q8_0 blocks) the activations are ggml's `block_q8_1` and every sum runs in ggml's order:
//!   the products are ggml's bit for bit ([`super::ggml`]).
//!
//! The int8 activations live in a per-thread scratch that grows once to the largest row set
//! seen (kernel internals, like faer's workspace, not tensors of the engine's plan). IC must be a
//! multiple of 32.

/// `$name::<R>`: `$kernel` (generic over the activation-row count `R`, 1..=8), compiled for a
/// level's features (`avx2`, `avxvnni`, `avx512bw`: AVX-512 F, BW and VL, or `avx512vnni`);
/// each level's entry points into the kernels.
///
/// # Safety
/// The CPU must have the level's features; `q` holds `R` quantized rows of IC; `w` holds the
/// (OC, IC) matrix, in the layout `$kernel` reads; `range` is whole tiles where `w` is tiled.
macro_rules! kernel_with {
    ($name:ident, avx2, $($k:tt)+) => {
        kernel_with!(@ $name, "avx2,fma,f16c", $($k)+);
    };
    ($name:ident, avxvnni, $($k:tt)+) => {
        kernel_with!(@ $name, "avx2,fma,f16c,avxvnni", $($k)+);
    };
    ($name:ident, avx512bw, $($k:tt)+) => {
        kernel_with!(@ $name, "avx2,fma,f16c,avx512f,avx512bw,avx512vl", $($k)+);
    };
    ($name:ident, avx512vnni, $($k:tt)+) => {
        kernel_with!(@ $name, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", $($k)+);
    };
    (@ $name:ident, $features:literal, $($kernel:tt)+) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const R: usize>(
            out: &mut [f32],
            q: &QActs,
            w: &Weights,
            ic: usize,
            oc: usize,
            range: Range<usize>,
        ) {
            $($kernel)+(out, q, w, ic, oc, range)
        }
    };
}

mod grouped;
mod int4;
mod nf4;
mod quantize;
mod tiled;
mod tiled512;
mod tiled8;
mod tiled_nf4;

pub(super) use quantize::{dequantized, quantize};
use tiled512::{tiles_bw, tiles_vnni};
use tiled8::{tiles8_avx2, tiles8_bw, tiles8_vex, tiles8_vnni};
use tiled_nf4::{tiles_nf4_avx2, tiles_nf4_bw, tiles_nf4_vex, tiles_nf4_vnni};

use super::ROWS;
use half::f16;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

/// One call's activations: `rows` rows of IC int8 codes in their natural order, one scale and
/// one code sum per block of 32, and per row and weight group the scaled sum of its codes.
#[derive(Default)]
pub(super) struct QActs {
    codes: Vec<i8>,
    scales: Vec<f32>,
    group_sums: Vec<f32>,
    /// Codes laid out for int4 and nf4 in pairs of blocks: per 64 values, the two blocks' first
    /// halves (32 bytes, as the weight vector's low nibbles hold them), then their second halves.
    paired: bool,
    /// Per row and pair of blocks: 8 scales, the first block's four times, then the second's.
    pair_scales: Vec<f32>,
    /// Per row and block, −128 × the block's code sum: what weights offset by 128 (int8 as
    /// unsigned bytes, [`tiled8`]) add to the block's integer sum, taken off it.
    offsets: Vec<i32>,
}

thread_local! {
    /// This thread's activation scratches: one per product running on it at once (a rayon
    /// task stolen while a product waits runs another), kept for reuse.
    static SCRATCH: RefCell<Vec<QActs>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with one of this thread's activation scratches (see `vnni::with_scratch`).
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut QActs) -> R) -> R {
    let mut q = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let out = f(&mut q);
    SCRATCH.with(|s| s.borrow_mut().push(q));
    out
}

/// The weights this path multiplies.
pub(super) enum Weights<'a> {
    Int4 {
        codes: &'a [u8],
        scales: &'a [f16],
        zeros: Option<&'a [u8]>,
        group: usize,
    },
    /// int4 in tiles of eight output rows ([`super::tiles`]).
    Int4Tiled {
        codes: &'a [u8],
        scales: &'a [f16],
        zeros: Option<&'a [u8]>,
        group: usize,
    },
    Int8 {
        codes: &'a [i8],
        scales: &'a [f16],
    },
    /// int8 in tiles of eight output rows ([`super::tiles::tile_codes8`]).
    Int8Tiled {
        codes: &'a [i8],
        scales: &'a [f16],
    },
    Grouped {
        codes: Codes<'a>,
        scales: &'a [f32],
        mins: Option<&'a [f32]>,
        group: usize,
    },
    /// nf4 in int4's tiles of eight output rows, its levels as signed bytes ([`lut4`]) whose unit
    /// multiplies each group's scale.
    Nf4Tiled {
        codes: &'a [u8],
        scales: &'a [f32],
        table: [i8; 16],
        unit: f32,
        group: usize,
    },
}

/// A grouped weight's codes: one signed byte each, or 0..15 two per byte (int4's order), or
/// 0..15 two per byte indexing a table of 16 signed bytes (nf4's levels, [`lut4`]) whose unit
/// multiplies each group's scale.
#[derive(Clone, Copy)]
pub(super) enum Codes<'a> {
    I8(&'a [i8]),
    U4(&'a [u8]),
    Lut4 {
        codes: &'a [u8],
        table: [i8; 16],
        unit: f32,
    },
}

/// A 4-bit code table as signed bytes: `levels` over their largest magnitude m, times 127,
/// rounded to nearest even, and the unit m / 127 one step of the table is worth (as
/// llama.cpp's IQ4_NL holds its non-linear levels). A weight s · levels[c] becomes
/// (s · unit) · table[c], within half a unit of s.
pub(super) fn lut4(levels: &[f32; 16]) -> ([i8; 16], f32) {
    let m = levels.iter().fold(0.0f32, |m, l| m.max(l.abs()));
    if m == 0.0 {
        return ([0; 16], 0.0);
    }
    let table = std::array::from_fn(|i| (levels[i] / m * 127.0).round_ties_even() as i8);
    (table, m / 127.0)
}

/// How a block's four-product sums are formed: `vpmaddubsw` then `vpmaddwd` (AVX2; `Bw`: on
/// AVX-512 BW, whose int4 tiles run two to a 512-bit vector), or one `vpdpbusd`, EVEX-encoded
/// (AVX-512 VL and VNNI, tiles in 512 bits too) or VEX-encoded (AVX-VNNI). The same integers
/// either way, so the same results.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dot {
    Pairs,
    Bw,
    Evex,
    Vex,
}

const PAIRS: u8 = 0;
const EVEX: u8 = 1;
const VEX: u8 = 2;

/// out[r][o] for `rows` activation rows and the output rows in `range`, the sums formed as
/// `dot` says.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and what `dot` names (AVX-512 F, BW and VL for `Bw`, with
/// VNNI for `Evex`, or AVX-VNNI); `q` holds `rows` quantized rows of IC; the weights hold the
/// matrix (OC, IC).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows(
    out: &mut [f32],
    q: &QActs,
    w: &Weights,
    rows: usize,
    ic: usize,
    oc: usize,
    range: Range<usize>,
    dot: Dot,
) {
    let tiles = matches!(w, Weights::Int4Tiled { .. });
    if let Weights::Int8Tiled { .. } = w {
        return match dot {
            Dot::Evex => by_rows!(rows, tiles8_vnni(out, q, w, ic, oc, range)),
            Dot::Bw => by_rows!(rows, tiles8_bw(out, q, w, ic, oc, range)),
            Dot::Vex => by_rows!(rows, tiles8_vex(out, q, w, ic, oc, range)),
            Dot::Pairs => by_rows!(rows, tiles8_avx2(out, q, w, ic, oc, range)),
        };
    }
    if let Weights::Nf4Tiled { .. } = w {
        return match dot {
            Dot::Evex => by_rows!(rows, tiles_nf4_vnni(out, q, w, ic, oc, range)),
            Dot::Bw => by_rows!(rows, tiles_nf4_bw(out, q, w, ic, oc, range)),
            Dot::Vex => by_rows!(rows, tiles_nf4_vex(out, q, w, ic, oc, range)),
            Dot::Pairs => by_rows!(rows, tiles_nf4_avx2(out, q, w, ic, oc, range)),
        };
    }
    match dot {
        Dot::Evex if tiles => by_rows!(rows, tiles_vnni(out, q, w, ic, oc, range)),
        Dot::Bw if tiles => by_rows!(rows, tiles_bw(out, q, w, ic, oc, range)),
        Dot::Evex => by_rows!(rows, rows_evex(out, q, w, ic, oc, range)),
        Dot::Vex => by_rows!(rows, rows_vex(out, q, w, ic, oc, range)),
        Dot::Pairs | Dot::Bw => by_rows!(rows, rows_avx2(out, q, w, ic, oc, range)),
    }
}

// [`rows_n`] with the sums by `vpmaddubsw`, EVEX `vpdpbusd` or VEX `vpdpbusd`.
kernel_with!(rows_avx2, avx2, rows_n::<R, PAIRS>);
kernel_with!(rows_evex, avx512vnni, rows_n::<R, EVEX>);
kernel_with!(rows_vex, avxvnni, rows_n::<R, VEX>);

#[inline(always)]
unsafe fn rows_n<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    w: &Weights,
    ic: usize,
    oc: usize,
    range: Range<usize>,
) {
    assert!(R <= ROWS);
    assert!(q.codes.len() >= R * ic && q.scales.len() >= R * ic / 32);
    // From 4 activation rows on, two output rows at a time: each activation block loaded (and
    // its scale broadcast) serves both. At one row, int8 weights four output rows at a time:
    // four weight rows stream at once and four sums run apart, instead of each block waiting
    // on the last one's multiply-add (TinyLlama decode at batch 1, 2 cores: 1.2-1.4x; 4-bit
    // weights ran slower so, ggml's blocks no faster). Each output's sum runs in the same
    // order whatever the outputs a pass takes.
    if let Weights::Int4Tiled {
        codes,
        scales,
        zeros,
        group,
    } = *w
    {
        assert!(range.start.is_multiple_of(8) && range.end.is_multiple_of(8));
        for o0 in range.step_by(8) {
            tiled::tile::<R, V>(out, q, codes, scales, zeros, group, ic, oc, o0);
        }
        return;
    }
    let mut o = range.start;
    while R == 1 && matches!(w, Weights::Int8 { .. }) && o + 4 <= range.end {
        outputs::<R, 4, V>(out, q, w, ic, oc, o);
        o += 4;
    }
    while (4..=5).contains(&R) && o + 2 <= range.end {
        outputs::<R, 2, V>(out, q, w, ic, oc, o);
        o += 2;
    }
    while o < range.end {
        outputs::<R, 1, V>(out, q, w, ic, oc, o);
        o += 1;
    }
}

/// u8 × i8 summed four at a time into 8 int32 lanes (lane k: bytes 4k..4k+4), added to `acc`:
/// one `vpdpbusd` with VNNI (`V` EVEX or VEX), else 16 pair sums then their pairs.
#[inline(always)]
unsafe fn dot_add<const V: u8>(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    match V {
        EVEX => _mm256_dpbusd_epi32(acc, w, a),
        VEX => _mm256_dpbusd_avx_epi32(acc, w, a),
        _ => {
            let pairs = _mm256_maddubs_epi16(w, a);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// As [`dot_add`] from zero, as f32.
#[inline(always)]
unsafe fn dot32<const V: u8>(w: __m256i, a: __m256i) -> __m256 {
    if V == PAIRS {
        let pairs = _mm256_maddubs_epi16(w, a);
        return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
    _mm256_cvtepi32_ps(dot_add::<V>(_mm256_setzero_si256(), w, a))
}

/// Output rows `o0 .. o0 + O` for the `R` activation rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn outputs<const R: usize, const O: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    w: &Weights,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let blocks = ic / 32;
    let (acodes, ascales) = (q.codes.as_ptr(), q.scales.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    match *w {
        Weights::Int4 {
            codes,
            scales,
            zeros,
            group,
        } => int4::outputs::<R, O, V>(out, q, codes, scales, zeros, group, ic, oc, o0),
        Weights::Int4Tiled { .. } | Weights::Int8Tiled { .. } | Weights::Nf4Tiled { .. } => {
            unreachable!("tiles run whole in rows_n, tiled8 and tiled_nf4")
        }
        Weights::Int8 { codes, scales } => {
            let wrow: [*const i8; O] = std::array::from_fn(|j| codes.as_ptr().add((o0 + j) * ic));
            let far = ic >= FAR;
            for s in 0..blocks {
                if far && s % 2 == 0 {
                    for row in wrow {
                        prefetch_next(row as *const u8, s * 32, O * ic);
                    }
                }
                let wv: [__m256i; O] = std::array::from_fn(|j| {
                    _mm256_loadu_si256(wrow[j].add(s * 32) as *const __m256i)
                });
                let wabs: [__m256i; O] = std::array::from_fn(|j| _mm256_sign_epi8(wv[j], wv[j]));
                for r in 0..R {
                    let a = _mm256_loadu_si256(acodes.add(r * ic + s * 32) as *const __m256i);
                    let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
                    for j in 0..O {
                        let p = dot32::<V>(wabs[j], _mm256_sign_epi8(a, wv[j]));
                        acc[j][r] = _mm256_fmadd_ps(p, da, acc[j][r]);
                    }
                }
            }
            for j in 0..O {
                let row_scale = scales[o0 + j].to_f32();
                for r in 0..R {
                    out[r * oc + o0 + j] = row_scale * hsum(acc[j][r]);
                }
            }
        }
        Weights::Grouped {
            codes,
            scales,
            mins,
            group,
        } => grouped::outputs::<R, O, V>(out, q, codes, scales, mins, group, ic, oc, o0),
    }
}

/// Asks for the cache line at byte `at` of the row `ahead` bytes past `row`: the same place in
/// a row this task reads next, so the next passes' weights stream in while this one computes.
/// Callers ask once a line, and only for rows of 1 KiB or more ([`FAR`]): shorter ones the
/// hardware's own prefetcher follows, and the extra work slowed SmolLM2's 288-byte rows.
#[inline(always)]
pub(super) unsafe fn prefetch_next(row: *const u8, at: usize, ahead: usize) {
    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(at + ahead) as *const i8);
}

/// How far ahead of its reads a tile loop asks for its stream's lines, and into which cache (the
/// hardware's own prefetchers stop at pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ahead {
    /// Bytes past the line being read.
    pub(super) bytes: usize,
    /// Into L2 (`prefetcht1`), else into L1 (`prefetcht0`).
    pub(super) l2: bool,
    /// As reports name it.
    pub(super) name: &'static str,
}

impl Ahead {
    /// Into L1 a page ahead: on a Xeon model 207 capped to AVX2 (2 cores, 2048 × 2048 int4, 40
    /// matrices) 4 KiB read 15.3-15.7 GB/s at one activation row where none read 10.2 and 1 KiB
    /// 14.0 (8 KiB and 16 KiB no faster), and lifted 8 rows from 60 to 76 GMAC/s. The int8 tiles
    /// keep it everywhere (on 2 Zen 4 cores [`Ahead::int4`]'s ran them no faster at one row and
    /// 5-10% slower at eight), and so do the nf4 tiles.
    pub(super) const PAGE: Ahead = Ahead {
        bytes: 4 << 10,
        l2: false,
        name: "l1-4k",
    };

    /// The int4 tiles' (both widths): on AMD's cores into L2, 32 KiB ahead, [`Ahead::PAGE`]
    /// elsewhere. On 2 Zen 4 cores a page into L1 left TinyLlama int4 decode at batch 1 at
    /// 0.56-0.72 of the streaming read uncapped and at `avx512` (each core's L1 holds too few
    /// misses in flight); 32 KiB into L2 ran it 1.10-1.33x faster there, and the 4096 × 11008
    /// model pass of `cargo bench -p kernels --bench qmatmul` 1.09-1.34x at `avx512vnni` and
    /// 1.02-1.13x at `avx2` (docs/results.md). Only that Zen 4 measured it.
    pub(super) fn int4() -> Ahead {
        if crate::cpu::amd() {
            Ahead {
                bytes: 32 << 10,
                l2: true,
                name: "l2-32k",
            }
        } else {
            Ahead::PAGE
        }
    }

    /// Asks for the `lines` cache lines from `self.bytes` past `p`.
    #[inline(always)]
    pub(super) unsafe fn lines(self, p: *const u8, lines: usize) {
        let p = p.wrapping_add(self.bytes) as *const i8;
        for l in 0..lines {
            if self.l2 {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l));
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l));
            }
        }
    }
}

/// Whether the 512-bit int8 and nf4 tile loops take two tiles side by side for `rows` activation
/// rows. Not at one row on AMD's cores: there one tile at a time reads one stream of weights a
/// task, not two (2 Zen 4 cores, batch-1 TinyLlama decode, alternating rounds: int8 0.74-0.91
/// of the streaming read against 0.62-0.85 over seven, nf4 0.81-0.84 against 0.72-0.82 over
/// four). Every path gives the same bits, so this only moves speed.
pub(super) fn side_by_side(rows: usize) -> bool {
    rows > 1 || !crate::cpu::amd()
}

/// The row length from which the weight loops prefetch the next pass's rows.
pub(super) const FAR: usize = 1024;

/// Pair `p` of 4-bit blocks in each of the `O` weight rows (IC codes two a byte): one 32-byte
/// load, split into both blocks' low nibbles (weights 0..16 of each) and their high ones. Rows
/// of [`FAR`] bytes or more first ask, every other pair, for the line two passes ahead (a little
/// faster than one for int4: TinyLlama, AVX2, 2 cores).
#[inline(always)]
pub(super) unsafe fn pair_nibbles<const O: usize>(
    wrow: [*const u8; O],
    p: usize,
    ic: usize,
) -> ([__m256i; O], [__m256i; O]) {
    if ic / 2 >= FAR && p.is_multiple_of(2) {
        for row in wrow {
            prefetch_next(row, p * 32, 2 * O * ic / 2);
        }
    }
    let low = _mm256_set1_epi8(0x0F);
    let v: [__m256i; O] =
        std::array::from_fn(|j| _mm256_loadu_si256(wrow[j].add(p * 32) as *const __m256i));
    let lo = std::array::from_fn(|j| _mm256_and_si256(v[j], low));
    let hi = std::array::from_fn(|j| _mm256_and_si256(_mm256_srli_epi16::<4>(v[j]), low));
    (lo, hi)
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0x4E>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0xB1>(s)))
}
