//! GEMM with bf16 inputs and f32 accumulation: `out (M,N) (+)= a (M,K) · b (N,K)ᵀ`, both operands
//! with K contiguous (activations times an `nn.Linear` weight), for `--precision bf16`.
//!
//! Five paths, the fastest that [`crate::cpu::level`] allows chosen at run time: AMX tiles
//! (`amx`); AVX-512 BF16 (`vdpbf16ps`: 32 bf16 products summed pairwise into 16 f32 lanes per
//! instruction) — a register-tiled kernel over `b` packed into 16-column panels of K pairs
//! (`packed`) from 64 rows of `a` on, 4×4 dot-product tiles below; bf16 widened while packing
//! and multiplied in f32 (`avx2`), by a 12×32 AVX-512F micro-kernel on AVX-512 CPUs without BF16
//! or a 6×16 AVX2 + FMA one (the same bits); and a portable path that widens bf16 to f32 (a
//! 16-bit shift) in 16-lane dot products, in blocks of 64 rows of `a`, each sweeping `b` in
//! 64-row blocks that stay in L2.
//! [`gemm_nn`] takes `b` as (K, N), row-major over N, and reads it in place (`nn`): the
//! classifier's input gradient over the token table and backward GEMMs need no copy of `b`.
//! [`reference`] is the plain loop both are tested against. A GEMM whose `a` has its reduction
//! axis strided needs a transposed copy first ([`transpose`]).
//!
//! ```
//! use linalg::gemm_bf16::{gemm_nt, bf16};
//! use linalg::gemm_bf16::Accum;
//! let a: Vec<bf16> = [1.0f32, 2.0].iter().map(|&x| bf16::from_f32(x)).collect(); // (1, 2)
//! let b: Vec<bf16> = [3.0f32, 4.0, 5.0, 6.0].iter().map(|&x| bf16::from_f32(x)).collect(); // (2, 2)
//! let mut out = [0.0f32; 2];
//! gemm_nt(&mut out, &a, &b, (1, 2, 2), Accum::Replace);
//! assert_eq!(out, [11.0, 17.0]);
//! ```

use crate::cpu::{self, Level};
pub use faer::Accum;
pub use half::bf16;

/// A GEMM's sizes (M, N, K): out (M, N), a (M, K), b (K, N) or (N, K).
pub type Dims = (usize, usize, usize);
use rayon::prelude::*;

/// Rows of `a` per rayon task, and rows of `b` per cache block (64 × K bf16 = 96 KiB at K = 768).
const MB: usize = 64;
const NB: usize = 64;

/// Which instruction set runs the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AMX tiles (`tdpbf16ps`, `amx`); panics if the CPU or the OS does not grant them.
    Amx,
    /// `vdpbf16ps`; panics if the CPU lacks AVX-512 BF16 (see [`best_isa`]).
    Avx512Bf16,
    /// Widened to f32 while packing, f32 FMA in 512 bits (`avx2`'s 12 × 32 kernel); panics
    /// without AVX-512F.
    Avx512,
    /// Widened to f32 while packing, f32 FMA (`avx2`); panics without AVX2 and FMA.
    Avx2,
    /// Widen to f32 and multiply-add; runs anywhere.
    Portable,
}

impl Isa {
    /// The path's name in reports: `amx`, `avx512-bf16`, `avx512`, `avx2`, `portable`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512Bf16 => "avx512-bf16",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// The path a level runs: AVX-512 without BF16 widens as AVX2 does, in 512 bits.
    pub fn at(level: Level) -> Isa {
        match level {
            Level::Amx => Isa::Amx,
            Level::Avx512Bf16 => Isa::Avx512Bf16,
            Level::Avx512Vnni | Level::Avx512 => Isa::Avx512,
            Level::Avx2Vnni | Level::Avx2 => Isa::Avx2,
            Level::Portable => Isa::Portable,
        }
    }
}

/// The path the kernels run now: the fastest under [`crate::cpu::level`].
pub fn best_isa() -> Isa {
    Isa::at(cpu::level())
}

/// Every path this CPU runs, fastest first (tests and benchmarks compare them), whatever the cap.
pub fn supported() -> &'static [Isa] {
    static ISAS: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
    ISAS.get_or_init(|| {
        let mut isas: Vec<Isa> = cpu::supported().into_iter().rev().map(Isa::at).collect();
        isas.dedup();
        isas
    })
}

/// Whether the CPU has AMX-BF16 tiles and the OS grants them (asked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_available() -> bool {
    amx::available()
}

/// out (M,N) f32, a (M,K) bf16, b (N,K) bf16, on the best path for this CPU.
pub fn gemm_nt(out: &mut [f32], a: &[bf16], b: &[bf16], dims: Dims, accum: Accum) {
    gemm_nt_on(best_isa(), out, a, b, dims, accum);
}

/// As [`gemm_nt`] on a chosen path (benchmarks and tests compare the two).
pub fn gemm_nt_on(isa: Isa, out: &mut [f32], a: &[bf16], b: &[bf16], dims: Dims, accum: Accum) {
    let (m, n, k) = dims;
    let sizes = (out.len(), a.len(), b.len());
    if !work_to_do(isa, sizes, (m, n, k), "b (N,K)") {
        return;
    }
    let add = matches!(accum, Accum::Add);
    if k == 0 {
        if !add {
            out.fill(0.0);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx {
        let out = nn::Out::F32(out);
        // SAFETY: AMX was checked against the running CPU and OS above.
        return unsafe { amx::gemm(out, a, b, (m, n, k), (add, nn::Layout::Nt)) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        let out = nn::Out::F32(out);
        // SAFETY: the path's features were checked against the running CPU above.
        return unsafe { avx2::gemm(out, a, b, (m, n, k), (add, nn::Layout::Nt), isa) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Bf16 && m >= packed::MIN_ROWS {
        // SAFETY: Avx512Bf16 was checked against the running CPU above.
        return unsafe { packed::gemm(out, a, b, (m, n, k), add) };
    }
    out.par_chunks_mut(MB * n).enumerate().for_each(|(blk, o)| {
        let rows = o.len() / n;
        let a_blk = &a[blk * MB * k..][..rows * k];
        for j0 in (0..n).step_by(NB) {
            for i0 in (0..rows).step_by(4) {
                for jj in (j0..n.min(j0 + NB)).step_by(4) {
                    let tile = Tile {
                        i0,
                        jj,
                        mr: 4.min(rows - i0),
                        nr: 4.min(n - jj),
                        n,
                        k,
                        add,
                    };
                    match isa {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: Avx512Bf16 was checked against the running CPU above.
                        Isa::Avx512Bf16 => unsafe { avx512::tile_4x4(o, a_blk, b, tile) },
                        _ => portable_tile(o, a_blk, b, tile),
                    }
                }
            }
        }
    });
}

/// out (M,N) f32 (+)= a (M,K) bf16 · b (K,N) bf16, `b` row-major over N and read in place
/// (no packed or transposed copy: see `nn`), on the best path for this CPU.
pub fn gemm_nn(out: &mut [f32], a: &[bf16], b: &[bf16], dims: Dims, accum: Accum) {
    gemm_nn_on(best_isa(), out, a, b, dims, accum);
}

/// As [`gemm_nn`] on a chosen path.
pub fn gemm_nn_on(isa: Isa, out: &mut [f32], a: &[bf16], b: &[bf16], dims: Dims, accum: Accum) {
    run_nn(isa, nn::Out::F32(out), a, b, dims, accum);
}

/// out (M,N) bf16 (+)= a (M,K) bf16 · b (K,N) bf16, as [`gemm_nn`] but into 2 bytes: each
/// element widened, its whole K sum added in f32 and rounded once (a 2-byte gradient written
/// directly, no f32 copy of it), on the best path for this CPU.
pub fn gemm_nn_bf16(out: &mut [bf16], a: &[bf16], b: &[bf16], dims: Dims, accum: Accum) {
    gemm_nn_bf16_on(best_isa(), out, a, b, dims, accum);
}

/// As [`gemm_nn_bf16`] on a chosen path.
pub fn gemm_nn_bf16_on(
    isa: Isa,
    out: &mut [bf16],
    a: &[bf16],
    b: &[bf16],
    dims: Dims,
    accum: Accum,
) {
    run_nn(isa, nn::Out::Bf16(out), a, b, dims, accum);
}

/// Both `nn` GEMMs: the shape checks, an empty K (out replaced by zeros or left), the kernel.
fn run_nn(
    isa: Isa,
    out: nn::Out<'_>,
    a: &[bf16],
    b: &[bf16],
    (m, n, k): (usize, usize, usize),
    accum: Accum,
) {
    let len = match &out {
        nn::Out::F32(o) => o.len(),
        nn::Out::Bf16(o) => o.len(),
    };
    if !work_to_do(isa, (len, a.len(), b.len()), (m, n, k), "b (K,N)") {
        return;
    }
    let add = matches!(accum, Accum::Add);
    if k == 0 {
        match out {
            nn::Out::F32(o) if !add => o.fill(0.0),
            nn::Out::Bf16(o) if !add => o.fill(bf16::ZERO),
            _ => {}
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx {
        // SAFETY: AMX was checked against the running CPU and OS above.
        return unsafe { amx::gemm(out, a, b, (m, n, k), (add, nn::Layout::Nn)) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: the path's features were checked against the running CPU above.
        return unsafe { avx2::gemm(out, a, b, (m, n, k), (add, nn::Layout::Nn), isa) };
    }
    nn::gemm(out, a, b, (m, n, k), add, isa == Isa::Avx512Bf16);
}

/// The checks both GEMMs make: the slices' lengths against out (M,N), a (M,K) and `b` (N·K
/// elements in either layout), the path against the CPU. False when out is empty.
fn work_to_do(
    isa: Isa,
    (out, a, b): (usize, usize, usize),
    (m, n, k): (usize, usize, usize),
    b_shape: &str,
) -> bool {
    assert!(
        out == m * n && a == m * k && b == n * k,
        "shapes: out (M,N), a (M,K), {b_shape}"
    );
    assert!(
        supported().contains(&isa),
        "this CPU (or OS) does not run the bf16 GEMM path {isa:?}"
    );
    m > 0 && n > 0
}

/// out (N,OC) f32 = inp (N,IC) bf16 · weight (OC,IC)ᵀ bf16 + bias (OC) f32.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    out: &mut [f32],
    inp: &[bf16],
    weight: &[bf16],
    bias: Option<&[f32]>,
    n: usize,
    ic: usize,
    oc: usize,
) {
    let accum = match bias {
        Some(bias) => {
            assert_eq!(bias.len(), oc);
            out.chunks_exact_mut(oc)
                .for_each(|row| row.copy_from_slice(bias));
            Accum::Add
        }
        None => Accum::Replace,
    };
    gemm_nt(out, inp, weight, (n, oc, ic), accum);
}

/// A block of up to 4×4 outputs at (i0, jj) within a task's rows.
#[derive(Clone, Copy)]
struct Tile {
    i0: usize,
    jj: usize,
    mr: usize,
    nr: usize,
    n: usize,
    k: usize,
    add: bool,
}

/// bf16 → f32 as a plain shift, which vectorises; `half`'s conversion also quiets signalling NaNs
/// with a branch that keeps LLVM from vectorising (a NaN stays a NaN either way).
#[inline(always)]
fn widen(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

fn portable_tile(o: &mut [f32], a: &[bf16], b: &[bf16], t: Tile) {
    for r in 0..t.mr {
        let ar = &a[(t.i0 + r) * t.k..][..t.k];
        for c in 0..t.nr {
            let br = &b[(t.jj + c) * t.k..][..t.k];
            let mut acc = [0.0f32; 16];
            let (ac, bc) = (ar.chunks_exact(16), br.chunks_exact(16));
            let tail: f32 = ac
                .remainder()
                .iter()
                .zip(bc.remainder())
                .map(|(x, y)| widen(*x) * widen(*y))
                .sum();
            for (x, y) in ac.zip(bc) {
                for l in 0..16 {
                    acc[l] += widen(x[l]) * widen(y[l]);
                }
            }
            let v = acc.iter().sum::<f32>() + tail;
            let dst = &mut o[(t.i0 + r) * t.n + t.jj + c];
            *dst = if t.add { *dst + v } else { v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod nn;

/// This thread's share of [`crate::warm_threads`].
pub(crate) fn warm_thread() {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::warm_thread();
        amx::warm_thread();
    }
}
mod transpose;
pub use transpose::transpose;
#[cfg(target_arch = "x86_64")]
mod packed;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{bf16, Tile};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support avx512f, avx512bw and avx512bf16; the tile must lie inside the slices.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn tile_4x4(o: &mut [f32], a: &[bf16], b: &[bf16], t: Tile) {
        // Rows past the edge repeat the last valid row; their results are not stored.
        let arow = |r: usize| a.as_ptr().add((t.i0 + r.min(t.mr - 1)) * t.k) as *const i16;
        let brow = |c: usize| b.as_ptr().add((t.jj + c.min(t.nr - 1)) * t.k) as *const i16;
        let (ap, bp) = (
            [arow(0), arow(1), arow(2), arow(3)],
            [brow(0), brow(1), brow(2), brow(3)],
        );
        let mut acc = [_mm512_setzero_ps(); 16];
        let mut kk = 0;
        while kk < t.k {
            // Masked loads: the K tail reads nothing past the row (masked lanes do not fault).
            let mask: __mmask32 = if t.k - kk >= 32 {
                !0
            } else {
                (1u32 << (t.k - kk)) - 1
            };
            let load = |p: *const i16| -> __m512bh {
                std::mem::transmute(_mm512_maskz_loadu_epi16(mask, p.add(kk)))
            };
            let av = [load(ap[0]), load(ap[1]), load(ap[2]), load(ap[3])];
            let bv = [load(bp[0]), load(bp[1]), load(bp[2]), load(bp[3])];
            for r in 0..4 {
                for c in 0..4 {
                    acc[r * 4 + c] = _mm512_dpbf16_ps(acc[r * 4 + c], av[r], bv[c]);
                }
            }
            kk += 32;
        }
        for r in 0..t.mr {
            for c in 0..t.nr {
                let v = _mm512_reduce_add_ps(acc[r * 4 + c]);
                let dst = &mut o[(t.i0 + r) * t.n + t.jj + c];
                *dst = if t.add { *dst + v } else { v };
            }
        }
    }
}

/// The plain loop: each product widened to f32, summed in order.
pub mod reference {
    use super::bf16;

    /// out (M,N) = a (M,K) · b (N,K)ᵀ.
    pub fn gemm_nt(out: &mut [f32], a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) {
        gemm(out, a, (m, n, k), |j, p| b[j * k + p]);
    }

    /// out (M,N) = a (M,K) · b (K,N).
    pub fn gemm_nn(out: &mut [f32], a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) {
        gemm(out, a, (m, n, k), |j, p| b[p * n + j]);
    }

    /// out (M,N) = a (M,K) · b, `b_at(j, p)` the element of column j, depth p.
    fn gemm(
        out: &mut [f32],
        a: &[bf16],
        (m, n, k): super::Dims,
        b_at: impl Fn(usize, usize) -> bf16,
    ) {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc += a[i * k + p].to_f32() * b_at(j, p).to_f32();
                }
                out[i * n + j] = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests;
