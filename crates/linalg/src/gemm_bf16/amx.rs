//! The AMX BF16 kernel (Intel Sapphire Rapids and later): `tdpbf16ps` multiplies a 16 × 32 bf16
//! tile of `a` by a 32 × 16 tile of `b` (16 K pairs of 16 columns, the pair layout `vdpbf16ps`
//! also wants) into a 16 × 16 f32 tile — 8,192 multiply-adds an instruction, 16 times an AVX-512
//! FMA's per cycle. Both layouts of `b` ((N, K) for `gemm_nt`, (K, N) for `gemm_nn`) and both
//! outputs (f32, or bf16 rounded once) run here.
//!
//! Work is a grid of (256 rows of `a`, 256 columns of `b`) tasks over rayon (a narrower `b`, the
//! classifier's chunk of rows, is one block: the token table as `a` is read once). A task sweeps
//! K in blocks of 512: it packs its block of `b` into 16-column panels of K pairs (zero-padded
//! past N and K), then for every 32 rows × 32 columns runs the 2 × 2 tile kernel
//! (tmm0-3 accumulate, tmm4-5 hold two row tiles of `a`, tmm6-7 two column tiles of `b`),
//! loading the accumulators from and storing them to the task's f32 block between K blocks. Two
//! row tiles of `a` are read in place (`tileloadd` with its row stride) for `gemm_nt` where 32
//! rows and whole K tiles exist, and otherwise packed tile by tile (`pack_a`), zero-padded past a
//! ragged group of rows or K block. The f32 block is written
//! to `out` last: added or replaced, or (bf16 out) widened, added and rounded once with
//! `convert::bf16_bits`' rule, as the AVX-512 path.
//!
//! Tiles are configured (`ldtilecfg`) at a task's start and released (`tilerelease`) at its end,
//! so no thread keeps AMX state between tasks. Linux hands AMX to a process only after it asks
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): [`available`] asks once. Rust's AMX
//! intrinsics are not stable, so the tile instructions are `asm!`.

use super::nn::{store_bf16, store_f32, Block, Layout, Out, OutPtr};
use super::{bf16, Dims};
use rayon::prelude::*;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows of `a` and columns of `b` per task (a narrower `b`, the classifier's chunk of rows, is
/// one block of its width rounded up to 32); K per block (a multiple of [`TK`]).
const MB: usize = 256;
const NB: usize = 256;
const KB: usize = 512;
/// K of one tile (32 bf16 = 64 bytes a row), rows of one tile, columns of one panel.
const TK: usize = 32;
const TR: usize = 16;
const PANEL: usize = 16;

/// Whether this CPU has AMX-BF16 and the OS lets this process use its tiles (asked once).
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        // CPUID.(7,0).EDX: bit 22 AMX-BF16, bit 24 AMX-TILE; packing and stores use AVX-512 BW/VL.
        let leaf = __cpuid_count(7, 0);
        let cpu = (leaf.edx >> 22) & 1 == 1
            && (leaf.edx >> 24) & 1 == 1
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl");
        cpu && request_tile_data()
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 when the kernel grants the tiles'
/// 8 KiB of state to every thread of the process.
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    if !cfg!(target_os = "linux") {
        return false;
    }
    let rc: i64;
    // SAFETY: a plain system call with two integer arguments; it writes no memory.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => rc,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    rc == 0
}

/// The 64-byte tile configuration: palette 1, every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// A thread's buffers, grown once: the packed block of `b`, a zero-padded copy of 32 rows of
/// `a`, the task's f32 block.
struct Scratch {
    b: Vec<u16>,
    a: Vec<u16>,
    c: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { b: Vec::new(), a: Vec::new(), c: Vec::new() })
    };
}

/// out (M, N) (+)= a (M, K) · b, `b` as `layout` says; K > 0.
///
/// # Safety
/// [`available`] must have returned true.
pub(super) unsafe fn gemm(out: Out<'_>, a: &[bf16], b: &[bf16], dims: Dims, mode: (bool, Layout)) {
    let (add, layout) = mode;
    let (m, n, k) = dims;
    let out = OutPtr::of(out, m * n);
    let nb = NB.min(n.div_ceil(2 * PANEL) * 2 * PANEL);
    let (blocks_m, blocks_n) = (m.div_ceil(MB), n.div_ceil(nb));
    (0..blocks_m * blocks_n).into_par_iter().for_each(|task| {
        let blk = Block::of(task, (MB, nb), (0, n), (m, n, k), (add, layout), out);
        let t = Task { blk, nb };
        SCRATCH.with(|cell| {
            let s = &mut *cell.borrow_mut();
            s.grow();
            // SAFETY: AMX was granted (the caller); the tasks' blocks of out are disjoint and
            // inside its M·N elements.
            unsafe { task_run(a, b, t, s) };
        });
    });
}

impl Scratch {
    /// Its fixed sizes (the first use on a thread sets them).
    fn grow(&mut self) {
        grow(&mut self.b, NB * KB);
        grow(&mut self.a, 2 * TR * KB);
        grow(&mut self.c, MB * NB);
    }
}

/// Gives this thread its task scratch now (see [`crate::warm_threads`]).
pub(super) fn warm_thread() {
    SCRATCH.with(|cell| {
        if let Ok(mut s) = cell.try_borrow_mut() {
            s.grow();
        }
    });
}

fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// A block of out ([`Block`]) in a grid `nb` wide (a multiple of 32: the f32 block's row stride
/// and the packed panels).
#[derive(Clone, Copy)]
struct Task {
    blk: Block,
    nb: usize,
}

impl std::ops::Deref for Task {
    type Target = Block;

    fn deref(&self) -> &Block {
        &self.blk
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn task_run(a: &[bf16], b: &[bf16], t: Task, s: &mut Scratch) {
    asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
    // Column groups of 32 the task computes (the second is skipped when cols <= 32).
    let groups = t.cols.div_ceil(2 * PANEL);
    for k0 in (0..t.k).step_by(KB) {
        let kn = KB.min(t.k - k0);
        let kp = kn.div_ceil(TK) * TK;
        let panel = kp * PANEL;
        match t.layout {
            Layout::Nt => pack_nt(&mut s.b, b, t, k0, kn, kp),
            Layout::Nn => pack_nn(&mut s.b, b, t, k0, kn, kp),
        }
        let tiles = kp / TK;
        for r in (0..t.rows).step_by(2 * TR) {
            // Two row tiles of a: `gemm_nt`'s in place where 32 rows and whole tiles of K exist
            // (its a, the activations, is usually in cache); otherwise packed tile by tile, each
            // 1 KiB in one piece (`gemm_nn`'s a, an output gradient of up to 6 MiB, streams
            // better packed: 1.0-1.15 TFLOP/s against 0.8-0.95 in place, 2 cores).
            let in_place = t.layout == Layout::Nt && r + 2 * TR <= t.rows && kn == kp;
            let (a0, a1, a_stride, a_step) = if in_place {
                let p = a.as_ptr().add((t.i0 + r) * t.k + k0) as *const u16;
                (p, p.add(TR * t.k), 2 * t.k, TK)
            } else {
                pack_a(&mut s.a, a, t, r, k0, kn, kp);
                let p = s.a.as_ptr();
                (p, p.add(tiles * TR * TK), 2 * TK, TR * TK)
            };
            for g in 0..groups {
                let c = s.c.as_mut_ptr().add(r * t.nb + g * 2 * PANEL);
                let (b0, b1) = (
                    s.b.as_ptr().add(2 * g * panel),
                    s.b.as_ptr().add((2 * g + 1) * panel),
                );
                if k0 == 0 {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                } else {
                    asm!(
                        "tileloadd tmm0, [{c} + {cs} * 1]",
                        "tileloadd tmm1, [{c} + {cs} * 1 + 64]",
                        "tileloadd tmm2, [{c2} + {cs} * 1]",
                        "tileloadd tmm3, [{c2} + {cs} * 1 + 64]",
                        c = in(reg) c,
                        c2 = in(reg) c.add(TR * t.nb),
                        cs = in(reg) 4 * t.nb,
                        options(nostack, readonly)
                    );
                }
                for q in (0..kp).step_by(TK) {
                    asm!(
                        // Each load just before its first product (tile registers are not
                        // renamed: a load waits for the products still reading its tile).
                        "tileloadd tmm4, [{a0} + {sa} * 1]",
                        "tileloadd tmm6, [{b0} + {bs} * 1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b1} + {bs} * 1]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a1} + {sa} * 1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0.add((q / TK) * a_step),
                        a1 = in(reg) a1.add((q / TK) * a_step),
                        sa = in(reg) a_stride,
                        // K pairs q/2.. of each panel: 32 u16 a pair.
                        b0 = in(reg) b0.add(q * PANEL),
                        b1 = in(reg) b1.add(q * PANEL),
                        bs = in(reg) 4 * PANEL,
                        options(nostack, readonly)
                    );
                }
                asm!(
                    "tilestored [{c} + {cs} * 1], tmm0",
                    "tilestored [{c} + {cs} * 1 + 64], tmm1",
                    "tilestored [{c2} + {cs} * 1], tmm2",
                    "tilestored [{c2} + {cs} * 1 + 64], tmm3",
                    c = in(reg) c,
                    c2 = in(reg) c.add(TR * t.nb),
                    cs = in(reg) 4 * t.nb,
                    options(nostack)
                );
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem));
    write_out(&s.c, t);
}

/// The task's block of `b` as panels of `kp` K (pairs side by side, 32 u16 a pair), zero past N
/// and past `kn`. `b` is (N, K): a pair is one u32 of a row of `b`, and one gather reads a pair
/// of each of a panel's 16 rows (an odd last K element is copied alone: its u32 would reach past
/// the row).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_nt(dst: &mut [u16], b: &[bf16], t: Task, k0: usize, kn: usize, kp: usize) {
    let panel = kp * PANEL;
    dst[..t.nb * kp].fill(0);
    // Element offsets of a panel's 16 rows from its first (the gather scales them by 2 bytes).
    let rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(t.k as i32),
    );
    for p in 0..t.cols.div_ceil(PANEL) {
        let cols = PANEL.min(t.cols - p * PANEL);
        let mask: __mmask16 = if cols == PANEL {
            !0
        } else {
            (1u16 << cols) - 1
        };
        let first = b.as_ptr().add((t.j0 + p * PANEL) * t.k + k0) as *const u16;
        let out = dst.as_mut_ptr().add(p * panel);
        for q in 0..kn / 2 {
            let at = _mm512_add_epi32(rows, _mm512_set1_epi32(2 * q as i32));
            let v = _mm512_mask_i32gather_epi32::<2>(
                _mm512_setzero_si512(),
                mask,
                at,
                first as *const i32,
            );
            _mm512_storeu_si512(out.add(q * 2 * PANEL) as *mut _, v);
        }
        if kn % 2 == 1 {
            for l in 0..cols {
                *out.add((kn / 2) * 2 * PANEL + 2 * l) = *first.add(l * t.k + kn - 1);
            }
        }
    }
}

/// As [`pack_nt`] for `b` (K, N): a pair interleaves 16 columns of two rows of `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_nn(dst: &mut [u16], b: &[bf16], t: Task, k0: usize, kn: usize, kp: usize) {
    let panel = kp * PANEL;
    // Lane 2l takes column l of the first row, lane 2l + 1 column l of the second.
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    for p in 0..t.nb / PANEL {
        let c0 = p * PANEL;
        let cols = PANEL.min(t.cols.saturating_sub(c0));
        let mask: __mmask16 = if cols == PANEL {
            !0
        } else {
            (1u16 << cols) - 1
        };
        let dst = dst.as_mut_ptr().add(p * panel);
        let src = b.as_ptr().add(k0 * t.n + t.j0 + c0) as *const i16;
        for q in 0..kp / 2 {
            let (k_lo, k_hi) = (2 * q, 2 * q + 1);
            let lo = match cols > 0 && k_lo < kn {
                true => _mm256_maskz_loadu_epi16(mask, src.add(k_lo * t.n)),
                false => _mm256_setzero_si256(),
            };
            let hi = match cols > 0 && k_hi < kn {
                true => _mm256_maskz_loadu_epi16(mask, src.add(k_hi * t.n)),
                false => _mm256_setzero_si256(),
            };
            let both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let v = _mm512_permutexvar_epi16(idx, both);
            _mm512_storeu_si512(dst.add(q * 2 * PANEL) as *mut _, v);
        }
    }
}

/// Rows `r..r + 32` of the task (fewer at its end) and K `k0..k0 + kn` of `a` as two rows of
/// `kp / 32` tiles of 16 rows × 32 K each (tile `h · kp/32 + q`, 64 bytes a row), zero past the
/// rows and `kn`: every `tileloadd` of `a` then reads 1 KiB in one piece.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_a(dst: &mut [u16], a: &[bf16], t: Task, r: usize, k0: usize, kn: usize, kp: usize) {
    let tiles = kp / TK;
    let valid = (2 * TR).min(t.rows - r);
    let dst = dst.as_mut_ptr();
    for rr in 0..2 * TR {
        let src = a.as_ptr().add((t.i0 + r + rr.min(valid - 1)) * t.k + k0) as *const i16;
        let base = dst.add(((rr / TR) * tiles * TR + rr % TR) * TK);
        for q in 0..tiles {
            let left = kn.saturating_sub(q * TK);
            let mask: __mmask32 = match (rr < valid, left >= TK) {
                (false, _) => 0,
                (true, true) => !0,
                (true, false) => (1u32 << left) - 1,
            };
            let v = _mm512_maskz_loadu_epi16(mask, src.add(q * TK));
            _mm512_storeu_si512(base.add(q * TR * TK) as *mut _, v);
        }
    }
}

/// The task's f32 block into out: added or replaced, or rounded into bf16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn write_out(c: &[f32], t: Task) {
    for r in 0..t.rows {
        for c0 in (0..t.cols).step_by(PANEL) {
            let cols = PANEL.min(t.cols - c0);
            let mask: __mmask16 = if cols == PANEL {
                !0
            } else {
                (1u16 << cols) - 1
            };
            let v = _mm512_loadu_ps(c.as_ptr().add(r * t.nb + c0));
            let at = (t.i0 + r) * t.n + t.j0 + c0;
            match t.out {
                OutPtr::F32(base) => store_f32((base as *mut f32).add(at), mask, v, t.add),
                OutPtr::Bf16(base) => store_bf16((base as *mut u16).add(at), mask, v, t.add),
            }
        }
    }
}
