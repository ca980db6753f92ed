//! Weight-only quantized matrix products for inference: `out (N,OC) = inp (N,IC) · Wᵀ`, with the
//! weight `W (OC,IC)` stored as fp32, bf16, int8, int4 or nf4 and dequantized inside the dot
//! product (fused: no f32 copy of the weight exists), activations and accumulation in f32.
//!
//! Stored layouts (what the engine's packer writes and the kernels read):
//! - `F32`, `Bf16`: row-major (OC, IC).
//! - `Int8`: one signed code per weight, row-major, and one fp16 scale per output row:
//!   w = scale[o] × code.
//! - `Int4`: groups of `group` weights along a row (32, 64 or 128), one fp16 scale and one zero
//!   point (0..15; 8 when symmetric) per group: w = scale × (q − zero). Codes are packed two per
//!   byte in sub-blocks of 32 weights (llama.cpp's Q4_0 order): byte j of a sub-block holds
//!   weight j in its low nibble and weight j + 16 in its high nibble.
//! - `Int4Tiled`, `Int8Tiled`: `Int4`'s or `Int8`'s bytes with each eight output rows
//!   interleaved ([`tiles`]), the layout the integer kernel reads fastest at every level from
//!   AVX2 up ([`tiles_int4`], [`tiles_int8`]; a backend tiles its weights as it loads them).
//! - `Nf4`: the same nibble order; a code indexes the 16 QLoRA levels (passed in, as the
//!   `formats` crate defines them) and is scaled by its group's fp32 absmax. `Nf4Tiled`: in
//!   int4's tiles ([`tiles_int4`] says where).
//! - `Grouped`: one signed code per weight, row-major, in groups of 16 or 32 along a row, each
//!   with an fp32 scale and, optionally, an fp32 minimum: w = scale × code + min. ggml's block
//!   types (Q4_0 … Q8_0, the k-quants) repack into it with their values exact.
//! - `Grouped4`: `Grouped` whose codes are 0..15 (ggml's 4-bit types: Q4_0 shifted by 8 into
//!   its minimum, Q4_1, Q4_K), packed two per byte in int4's sub-block order.
//!
//! Paths, chosen at run time ([`best_isa`] under [`crate::cpu::level`], never a compile-time
//! `target-cpu`): AVX-512 (16 lanes; int4 in rows on 512-bit VNNI where present and rows are whole
//! 128-weight chunks), AVX2 + FMA (8 lanes), the integer kernel `q8avx2` (int8 activations; int4,
//! int8 and nf4 in tiles, two to a 512-bit vector at the AVX-512 levels, int4 in rows where the
//! 512-bit VNNI kernel does not take them, int8 in rows, nf4 in rows in groups of 32 or more and
//! ggml's blocks at every level from AVX2 up; its sums by `vpmaddubsw`, AVX-VNNI or AVX-512 VNNI as
//! the level has them; `integer_weights` decides), and portable loops (ggml's blocks of 32 in
//! ggml's arithmetic there too, [`ggml`]: the same bits at every level). Up to [`ROWS`] activation
//! rows share one pass over the weights (a decode batch reads each weight once); larger inputs run
//! in passes of [`ROWS`] rows. Work is split over rayon by output rows. [`reference`] is the plain
//! loop every path is tested against.
//!
//! ```
//! use linalg::qmatmul::{matmul, QWeight};
//! let w = [1.0f32, 2.0, 3.0, 4.0]; // (OC = 2, IC = 2)
//! let mut out = [0.0f32; 2];
//! matmul(&mut out, &[1.0, 1.0], &QWeight::F32(&w), 1, 2, 2);
//! assert_eq!(out, [3.0, 7.0]);
//! ```

#[cfg(target_arch = "x86_64")]
#[macro_use]
mod by_rows;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod ggml;
mod portable;
#[cfg(target_arch = "x86_64")]
mod q8avx2;
#[cfg(target_arch = "x86_64")]
mod route;
mod stored;
pub mod tiles;
#[cfg(target_arch = "x86_64")]
mod vnni;

use crate::cpu::{self, Level};
use crate::par::SyncPtr;
use half::{bf16, f16};
use rayon::prelude::*;
pub use stored::{nibble, pack_nibbles};

/// Activation rows per pass over the weights.
pub const ROWS: usize = 8;

/// Weights per nibble sub-block (int4, nf4).
pub const SUB: usize = 32;

/// A weight matrix (OC, IC) in one of the stored layouts (see the module docs).
#[derive(Clone, Copy, Debug)]
pub enum QWeight<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    Int8 {
        codes: &'a [i8],
        scales: &'a [f16],
    },
    /// As `Int8`, in tiles of eight output rows ([`tiles::tile_codes8`]); OC a multiple of 8,
    /// IC of 32.
    Int8Tiled {
        codes: &'a [i8],
        scales: &'a [f16],
    },
    Int4 {
        codes: &'a [u8],
        scales: &'a [f16],
        /// One zero point per group; `None`: symmetric (8).
        zeros: Option<&'a [u8]>,
        group: usize,
    },
    /// As `Int4`, in tiles of eight output rows ([`tiles`]); OC a multiple of 8.
    Int4Tiled {
        codes: &'a [u8],
        scales: &'a [f16],
        zeros: Option<&'a [u8]>,
        group: usize,
    },
    Nf4 {
        codes: &'a [u8],
        scales: &'a [f32],
        levels: &'a [f32; 16],
        group: usize,
    },
    /// As `Nf4`, in int4's tiles of eight output rows ([`tiles`]), the scales per tile and group
    /// as int4's; OC a multiple of 8.
    Nf4Tiled {
        codes: &'a [u8],
        scales: &'a [f32],
        levels: &'a [f32; 16],
        group: usize,
    },
    Grouped {
        codes: &'a [i8],
        scales: &'a [f32],
        /// One minimum per group; `None`: zero.
        mins: Option<&'a [f32]>,
        group: usize,
    },
    /// As `Grouped`, with codes 0..15 packed two per byte in int4's sub-block order.
    Grouped4 {
        codes: &'a [u8],
        scales: &'a [f32],
        mins: Option<&'a [f32]>,
        group: usize,
    },
}

/// Which instruction set runs the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 VNNI: the integer kernel's sums in EVEX `vpdpbusd` (int4 tiles two a 512-bit
    /// vector; int4 rows of whole 128-weight chunks on the 512-bit VNNI kernel); AVX-512 for
    /// the float layouts.
    Avx512Vnni,
    Avx512,
    /// AVX2 with AVX-VNNI: the AVX2 path, its integer sums in one VEX `vpdpbusd`.
    Avx2Vnni,
    Avx2,
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx2Vnni => "avx2-vnni",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
}

/// The fastest path under [`crate::cpu::level`].
pub fn best_isa() -> Isa {
    Isa::at(cpu::level())
}

impl Isa {
    /// The path a level runs.
    pub fn at(level: Level) -> Isa {
        match level {
            Level::Portable => Isa::Portable,
            Level::Avx2 => Isa::Avx2,
            // set_cap and detection grant this level only with AVX-VNNI.
            Level::Avx2Vnni => Isa::Avx2Vnni,
            Level::Avx512 => Isa::Avx512,
            // Detection grants the levels above only with AVX-512 VNNI.
            _ => Isa::Avx512Vnni,
        }
    }

    /// Every path, plainest first.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx2Vnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ];

    /// Whether this CPU runs the path, whatever the cap.
    pub fn runs_here(self) -> bool {
        let level = cpu::detected();
        match self {
            Isa::Portable => true,
            Isa::Avx2 => level >= Level::Avx2,
            Isa::Avx2Vnni => cpu::avx_vnni_on_cpu(),
            Isa::Avx512 => level >= Level::Avx512,
            Isa::Avx512Vnni => cpu::vnni_on_cpu(),
        }
    }
}

/// Every path this CPU runs, plainest first, whatever the cap (tests and benchmarks run each).
pub fn supported() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.runs_here()).collect()
}

/// out (N,OC) = inp (N,IC) · Wᵀ on the best path for this CPU.
pub fn matmul(out: &mut [f32], inp: &[f32], w: &QWeight, n: usize, ic: usize, oc: usize) {
    matmul_on(best_isa(), out, inp, w, n, ic, oc);
}

/// Whether int4 (or nf4) weights of (OC, IC) in groups of `group` run fastest tiled ([`tiles`])
/// at `isa`: at every level from AVX2 up, where the integer kernel multiplies them eight outputs a
/// vector (sixteen, two tiles, at the AVX-512 levels). A backend that tiles a matrix must hand it
/// over as `Int4Tiled` (`Nf4Tiled`) at every level.
pub fn tiles_int4(isa: Isa, oc: usize, ic: usize, group: usize) -> bool {
    let groups = group.is_multiple_of(SUB) && group > 0 && ic.is_multiple_of(group);
    tiles_int8(isa, oc, ic) && groups
}

/// Whether int8 weights of (OC, IC) run fastest tiled ([`tiles::tile_codes8`]) at `isa`: at every
/// level from AVX2 up, as int4's ([`tiles_int4`]). A backend that tiles a matrix must hand it over
/// as `Int8Tiled` at every level.
pub fn tiles_int8(isa: Isa, oc: usize, ic: usize) -> bool {
    isa != Isa::Portable && oc.is_multiple_of(tiles::TILE) && ic.is_multiple_of(SUB)
}

/// The layout int4, int8 and nf4 weights run in at `isa`, as reports name it ([`tiles_int4`],
/// [`tiles_int8`] where the shape allows).
pub fn layout(isa: Isa) -> &'static str {
    match isa {
        Isa::Portable => "rows",
        _ => "tiles",
    }
}

/// Output rows per rayon task: enough to amortise the task, few enough to balance two cores.
fn task_rows(oc: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (oc / (8 * threads)).clamp(4, 256)
}

/// How the int4 tile loops at `isa` ask for their weights ahead of use, as reports name it: into
/// L2 32 KiB ahead on AMD's cores, into L1 4 KiB ahead on others; none at `portable`.
pub fn int4_prefetch(isa: Isa) -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        return q8avx2::Ahead::int4().name;
    }
    let _ = isa;
    "none"
}

/// As [`matmul`] on a chosen path (tests and benchmarks compare them).
pub fn matmul_on(
    isa: Isa,
    out: &mut [f32],
    inp: &[f32],
    w: &QWeight,
    n: usize,
    ic: usize,
    oc: usize,
) {
    assert!(
        out.len() == n * oc && inp.len() == n * ic,
        "out (N,OC), inp (N,IC)"
    );
    w.check(oc, ic);
    assert!(
        isa.runs_here(),
        "this CPU cannot run the {} path",
        isa.name()
    );
    let mut chunk = task_rows(oc);
    if let QWeight::Int4Tiled { .. } | QWeight::Int8Tiled { .. } | QWeight::Nf4Tiled { .. } = w {
        // Whole tiles; at the AVX-512 levels, whole pairs of them (one 512-bit vector).
        let wide = matches!(isa, Isa::Avx512 | Isa::Avx512Vnni);
        chunk = chunk.next_multiple_of(tiles::TILE << usize::from(wide));
    }
    #[cfg(target_arch = "x86_64")]
    if let (
        Isa::Avx512Vnni,
        QWeight::Int4 {
            codes,
            scales,
            zeros,
            group,
        },
    ) = (isa, *w)
    {
        if route::vnni_chunks(group, ic) {
            return vnni::with_scratch(|q| {
                for r0 in (0..n).step_by(ROWS) {
                    let rows = ROWS.min(n - r0);
                    vnni::quantize(q, &inp[r0 * ic..(r0 + rows) * ic], rows, ic, group);
                    let q = &*q;
                    by_columns(
                        &mut out[r0 * oc..(r0 + rows) * oc],
                        oc,
                        chunk,
                        |out, range| {
                            // SAFETY: the CPU has AVX-512 VNNI (checked above); IC is whole chunks.
                            unsafe {
                                vnni::rows(out, q, codes, scales, zeros, group, rows, ic, oc, range)
                            }
                        },
                    );
                }
            });
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some((weights, group)) = route::integer_weights(isa, w, ic) {
        // VNNI where the path has it: one instruction for four products.
        let dot = match isa {
            Isa::Avx512Vnni => q8avx2::Dot::Evex,
            Isa::Avx512 => q8avx2::Dot::Bw,
            Isa::Avx2Vnni => q8avx2::Dot::Vex,
            _ => q8avx2::Dot::Pairs,
        };
        return q8avx2::with_scratch(|q| {
            for r0 in (0..n).step_by(ROWS) {
                let rows = ROWS.min(n - r0);
                let a = &inp[r0 * ic..(r0 + rows) * ic];
                // SAFETY: the CPU runs `isa` (asserted above), so AVX2 and what `dot` names;
                // IC is whole blocks of 32.
                // int4 and nf4 multiply pairs of blocks where `q8avx2::paired` holds.
                let pairs = matches!(
                    weights,
                    q8avx2::Weights::Int4 { .. }
                        | q8avx2::Weights::Grouped {
                            codes: q8avx2::Codes::Lut4 { .. },
                            ..
                        }
                );
                let ggml = matches!(
                    weights,
                    q8avx2::Weights::Grouped {
                        group: 32,
                        codes: q8avx2::Codes::I8(_) | q8avx2::Codes::U4(_),
                        ..
                    }
                );
                unsafe { q8avx2::quantize(q, a, rows, ic, group, pairs, ggml) };
                let q = &*q;
                by_columns(
                    &mut out[r0 * oc..(r0 + rows) * oc],
                    oc,
                    chunk,
                    |out, range| {
                        // SAFETY: as above; `q` holds `rows` rows of IC.
                        unsafe { q8avx2::rows(out, q, &weights, rows, ic, oc, range, dot) }
                    },
                );
            }
        });
    }
    // ggml's blocks of 32 at the portable level: ggml's arithmetic as plain loops, the products
    // the integer paths give (for Q4_0 … Q8_0, llama.cpp's too).
    if isa == Isa::Portable && ggml::takes(w) {
        for r0 in (0..n).step_by(ROWS) {
            let rows = ROWS.min(n - r0);
            ggml::with_quantized(&inp[r0 * ic..(r0 + rows) * ic], ic, |a| {
                by_columns(
                    &mut out[r0 * oc..(r0 + rows) * oc],
                    oc,
                    chunk,
                    |out, range| ggml::rows(out, a, w, (ic, oc), range),
                );
            });
        }
        return;
    }
    // The float paths: VNNI changes only the integer ones.
    let isa = match isa {
        Isa::Avx512Vnni => Isa::Avx512,
        Isa::Avx2Vnni => Isa::Avx2,
        isa => isa,
    };
    for r0 in (0..n).step_by(ROWS) {
        let rows = ROWS.min(n - r0);
        let a = &inp[r0 * ic..(r0 + rows) * ic];
        by_columns(
            &mut out[r0 * oc..(r0 + rows) * oc],
            oc,
            chunk,
            |out, range| run_rows(isa, out, Rows { a, w, rows, ic, oc }, range),
        );
    }
}

/// Runs `f(out, columns)` over `out` (rows of `oc`) in rayon tasks of `chunk` columns each; a
/// task writes only its columns of every row.
fn by_columns(
    out: &mut [f32],
    oc: usize,
    chunk: usize,
    f: impl Fn(&mut [f32], std::ops::Range<usize>) + Sync,
) {
    let len = out.len();
    let dst = SyncPtr(out.as_mut_ptr());
    (0..oc.div_ceil(chunk)).into_par_iter().for_each(|t| {
        let (o0, o1) = (t * chunk, oc.min(t * chunk + chunk));
        // SAFETY: task t writes only columns o0..o1 of each row, disjoint from every other
        // task's; `out` outlives the parallel loop.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.get(), len) };
        f(out, o0..o1);
    });
}

/// What a float path multiplies: `rows` activation rows of `ic` (`a`) against the weight
/// rows of `w`, (OC, IC); a task writes columns `range` of each row of its `out` (rows, OC).
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub a: &'a [f32],
    pub w: &'a QWeight<'a>,
    pub rows: usize,
    pub ic: usize,
    pub oc: usize,
}

fn run_rows(isa: Isa, out: &mut [f32], p: Rows, range: std::ops::Range<usize>) {
    if let QWeight::Grouped { .. }
    | QWeight::Grouped4 { .. }
    | QWeight::Int4Tiled { .. }
    | QWeight::Int8Tiled { .. }
    | QWeight::Nf4Tiled { .. } = p.w
    {
        // Grouped and tiled weights run on the integer path from AVX2 up; below it, here
        // (ggml's groups of 32: `ggml::rows`).
        return portable::rows(out, p, range);
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: matmul_on checked that this CPU has AVX-512 F and BW.
        Isa::Avx512 => unsafe { avx512::rows(out, p, range) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: matmul_on checked that this CPU has AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { avx2::rows(out, p, range) },
        _ => portable::rows(out, p, range),
    }
}

/// The activations the AVX2 integer path multiplies (int8 per 32, dequantized), for exact
/// comparisons; IC a multiple of 32, on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
pub fn avx2_activations(inp: &[f32], n: usize, ic: usize) -> Vec<f32> {
    assert!(Isa::Avx2.runs_here(), "the AVX2 path needs AVX2");
    q8avx2::dequantized(inp, n, ic)
}

/// The activations the VNNI path multiplies (int8 per 32, dequantized), for exact comparisons.
#[cfg(target_arch = "x86_64")]
pub fn vnni_activations(inp: &[f32], n: usize, ic: usize) -> Vec<f32> {
    vnni::dequantized(inp, n, ic)
}

/// The plain loop: out[r][o] = Σ_i W(o, i) · inp[r][i], in f64.
pub fn reference(out: &mut [f32], inp: &[f32], w: &QWeight, n: usize, ic: usize, oc: usize) {
    w.check(oc, ic);
    for r in 0..n {
        for o in 0..oc {
            let s: f64 = (0..ic)
                .map(|i| f64::from(w.at(o, i, ic)) * f64::from(inp[r * ic + i]))
                .sum();
            out[r * oc + o] = s as f32;
        }
    }
}

#[cfg(test)]
mod tests;
