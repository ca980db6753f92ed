//! The 512-bit micro-kernel of the widening bf16 path, for AVX-512 CPUs without BF16: 12 rows ×
//! 32 columns, two of the 16-column panels side by side (24 accumulators, 2 panel loads and 12
//! broadcasts per 24 FMAs), a last odd panel 12 × 16. Tasks, packing and the output are
//! [`super`]'s; each element's sum is the same chain of FMAs in K order as the AVX2 kernel's,
//! so the two give the same bits.

use super::{pack_a, write_out, Scratch, Task, KC, NB, NR};
use std::arch::x86_64::*;

/// Rows of the micro-kernel (the task's 120 rows are ten of them).
pub(super) const MR: usize = 12;

/// [`super::task_run`] with the 512-bit kernel.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn task_run(s: &mut Scratch, a: &[half::bf16], packed: &[f32], t: Task) {
    let (row_panels, col_panels) = (t.rows.div_ceil(MR), t.cols.div_ceil(NR));
    // Panel q of the task starts here; panel q + 1 one panel (K × 16 f32) further.
    let stride = t.k * NR;
    for k0 in (0..t.k).step_by(KC) {
        let kc = KC.min(t.k - k0);
        pack_a(&mut s.a, a, t, (k0, kc), MR);
        for q in (0..col_panels).step_by(2) {
            let bp = packed.as_ptr().add(q * stride + k0 * NR);
            for p in 0..row_panels {
                let ap = s.a.as_ptr().add(p * MR * kc);
                let cp = s.c.as_mut_ptr().add(p * MR * NB + q * NR);
                match q + 1 < col_panels {
                    true => kernel::<2>((kc, stride), ap, bp, cp, k0 == 0),
                    false => kernel::<1>((kc, stride), ap, bp, cp, k0 == 0),
                }
            }
        }
    }
    write_out(&s.c, t);
}

/// c (12, 16·V; row stride NB) (+)= a panel (12 rows of kc, row-major) · V b panels (kc × 16
/// each, `stride` f32 apart).
#[inline(always)]
unsafe fn kernel<const V: usize>(
    (kc, stride): (usize, usize),
    ap: *const f32,
    bp: *const f32,
    cp: *mut f32,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; MR];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (v, x) in acc_r.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(cp.add(r * NB + v * NR));
            }
        }
    }
    for kk in 0..kc {
        let mut b = [_mm512_setzero_ps(); V];
        for (v, b_v) in b.iter_mut().enumerate() {
            *b_v = _mm512_loadu_ps(bp.add(v * stride + kk * NR));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*ap.add(r * kc + kk));
            for (v, x_v) in acc_r.iter_mut().enumerate() {
                *x_v = _mm512_fmadd_ps(x, b[v], *x_v);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, x) in acc_r.iter().enumerate() {
            _mm512_storeu_ps(cp.add(r * NB + v * NR), *x);
        }
    }
}
