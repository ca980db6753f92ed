//! One task's online softmax: a query row's head group over a range of its positions, in tiles
//! of [`TILE`] positions. Each tile's keys and values are found (and widened, where the cache is
//! not f32) once for the whole group. On x86 with AVX2 or AVX-512 (`x86.rs`) a head's scores run
//! eight keys at a time, their eight sums folded into one vector together, and its Σ p·v holds
//! up to 64 (AVX2) or 128 (AVX-512) columns in registers across the tile's positions; elsewhere
//! plain loops ([`Plain`]) do the same arithmetic.

use super::{KvSlice, Task, MAX_GROUP};
#[cfg(target_arch = "x86_64")]
use crate::fastmath::Simd;
use crate::fastmath::{exp_shifted_sum_body, exp_with, mul_add, row_max_body};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Positions per tile of the online softmax: scores for a tile, one rescale per tile.
pub(super) const TILE: usize = 32;

/// Scratch floats a task needs: the tile's Σ p·v and the compensation terms (G·HD each), and
/// the tile's keys and values widened to f32 (TILE·HD each).
pub(super) fn scratch_len(g: usize, hd: usize) -> usize {
    2 * g * hd + 2 * TILE * hd
}

thread_local! {
    /// A task's scratch ([`scratch_len`] floats), grown once per thread.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` floats of this thread's scratch (a fresh buffer when it is in use).
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// Online softmax of row r's head group h over positions `range`: unnormalised accumulators in
/// `acc` (G·HD), running maxima in `ml[..G]` and sums in `ml[MAX_GROUP..]`; `scratch` holds
/// [`scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_range(
    t: &Task,
    r: usize,
    h: usize,
    range: std::ops::Range<usize>,
    acc: &mut [f32],
    ml: &mut [f32; 2 * MAX_GROUP],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match crate::fastmath::simd() {
        // SAFETY: the CPU has AVX-512 F, AVX2 and FMA (fastmath::simd).
        Simd::Avx512 => return unsafe { x86::avx512(t, r, h, range, acc, ml, scratch) },
        // SAFETY: the CPU has AVX2 and FMA (as above).
        Simd::Avx2 => return unsafe { x86::avx2(t, r, h, range, acc, ml, scratch) },
        Simd::Base => {}
    }
    // SAFETY: plain Rust.
    unsafe { range_body::<Plain, false>(t, r, h, range, acc, ml, scratch) }
}

/// How a level forms a tile's scores and a head's weighted sum of the tile's values.
pub(super) trait Lanes {
    /// out[i] = scale · (qh · keys[i]).
    ///
    /// # Safety
    /// The CPU has the level's features; every key is as long as `qh`.
    unsafe fn scores(qh: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]);
    /// dst = Σ_i p[i] · values[i].
    ///
    /// # Safety
    /// As [`Lanes::scores`]; every value row is as long as `dst`.
    unsafe fn weighted(p: &[f32], values: &[&[f32]], dst: &mut [f32]);
}

/// Plain loops (baseline x86-64 and other targets): no fused multiply-adds.
pub(super) struct Plain;

impl Lanes for Plain {
    unsafe fn scores(qh: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]) {
        plain_scores::<false>(qh, keys, scale, out)
    }

    unsafe fn weighted(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
        plain_weighted::<false>(p, values, dst)
    }
}

/// [`Lanes::scores`] as plain loops (also the x86 levels' path for head dims off their widths).
#[inline(always)]
pub(super) fn plain_scores<const FMA: bool>(
    qh: &[f32],
    keys: &[&[f32]],
    scale: f32,
    out: &mut [f32],
) {
    for (x, key) in out.iter_mut().zip(keys) {
        *x = dot::<FMA>(qh, key) * scale;
    }
}

/// [`Lanes::weighted`] as plain loops (as [`plain_scores`]).
#[inline(always)]
pub(super) fn plain_weighted<const FMA: bool>(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
    dst.fill(0.0);
    for (pi, v) in p.iter().zip(values) {
        for (d, x) in dst.iter_mut().zip(*v) {
            *d = mul_add::<FMA>(*pi, *x, *d);
        }
    }
}

/// a · b in 16 lanes, then the lanes added in order.
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..16 {
            acc[j] = mul_add::<FMA>(x[j], y[j], acc[j]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The tile's rows `ats` of `cache` as f32 slices: the cache's own for f32, else widened into
/// `buf` (TILE·HD).
#[inline(always)]
fn tile_rows<'a>(
    cache: &KvSlice<'a>,
    ats: &[usize],
    hd: usize,
    buf: &'a mut [f32],
    out: &mut [&'a [f32]; TILE],
) {
    if let KvSlice::F32(c) = *cache {
        for (o, &at) in out.iter_mut().zip(ats) {
            *o = &c[at * hd..][..hd];
        }
        return;
    }
    for (dst, &at) in buf.chunks_exact_mut(hd).zip(ats) {
        cache.load(at, hd, dst);
    }
    for (o, row) in out.iter_mut().zip(buf.chunks_exact(hd)) {
        *o = row;
    }
}

/// The online softmax over `range` in tiles of [`TILE`] positions: each tile's Σ p·v is summed
/// fresh, then added to the running accumulator with Kahan compensation (and the sums of p in
/// f64), so 32k positions lose no more than a few ulps whatever the split.
///
/// # Safety
/// The CPU has `L`'s features, and FMA if `FMA` (the exponentials' multiply-adds).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn range_body<L: Lanes, const FMA: bool>(
    t: &Task,
    r: usize,
    h: usize,
    range: std::ops::Range<usize>,
    acc: &mut [f32],
    ml: &mut [f32; 2 * MAX_GROUP],
    scratch: &mut [f32],
) {
    let s = t.shape;
    let (hd, g, nkv, blk) = (s.head_dim, s.group(), s.n_kv_heads, s.block);
    let scale = 1.0 / (hd as f32).sqrt();
    let q = &t.q[r * t.q_width + h * g * hd..][..g * hd];
    let table = t.rows[r].blocks;
    acc.fill(0.0);
    let (tile_acc, rest) = scratch.split_at_mut(g * hd);
    let (comp, rest) = rest.split_at_mut(g * hd);
    let (kbuf, vbuf) = rest.split_at_mut(TILE * hd);
    comp.fill(0.0);
    let mut m = [f32::NEG_INFINITY; MAX_GROUP];
    let mut l = [0.0f64; MAX_GROUP];
    // Scores, then probabilities, of one tile for every head of the group.
    let mut sc = [0.0f32; MAX_GROUP * TILE];
    let mut ats = [0usize; TILE];
    let mut start = range.start;
    while start < range.end {
        let n = TILE.min(range.end - start);
        for (i, at) in ats[..n].iter_mut().enumerate() {
            let pos = start + i;
            *at = (table[pos / blk] as usize * nkv + h) * blk + pos % blk;
        }
        let mut keys: [&[f32]; TILE] = [&[]; TILE];
        tile_rows(t.k, &ats[..n], hd, kbuf, &mut keys);
        for gi in 0..g {
            let qh = &q[gi * hd..(gi + 1) * hd];
            L::scores(qh, &keys[..n], scale, &mut sc[gi * TILE..gi * TILE + n]);
        }
        for gi in 0..g {
            let row = &mut sc[gi * TILE..gi * TILE + n];
            let new_max = m[gi].max(row_max_body::<FMA>(row));
            let corr = exp_with::<FMA>(m[gi] - new_max);
            m[gi] = new_max;
            let sum = exp_shifted_sum_body::<FMA>(row, new_max);
            l[gi] = l[gi] * f64::from(corr) + sum;
            if corr != 1.0 {
                let span = gi * hd..(gi + 1) * hd;
                acc[span.clone()].iter_mut().for_each(|a| *a *= corr);
                comp[span].iter_mut().for_each(|c| *c *= corr);
            }
        }
        let mut values: [&[f32]; TILE] = [&[]; TILE];
        tile_rows(t.v, &ats[..n], hd, vbuf, &mut values);
        let values = &values[..n];
        for gi in 0..g {
            let p = &sc[gi * TILE..gi * TILE + n];
            L::weighted(p, values, &mut tile_acc[gi * hd..(gi + 1) * hd]);
        }
        // Kahan: acc += tile_acc, carrying each addition's rounding error in comp.
        for ((a, c), x) in acc.iter_mut().zip(comp.iter_mut()).zip(tile_acc.iter()) {
            let y = x - *c;
            let sum = *a + y;
            *c = (sum - *a) - y;
            *a = sum;
        }
        start += n;
    }
    ml[..g].copy_from_slice(&m[..g]);
    for gi in 0..g {
        ml[MAX_GROUP + gi] = l[gi] as f32;
    }
}
