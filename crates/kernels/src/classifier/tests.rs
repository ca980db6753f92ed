//! Tests for the parent module: reference backward against f64 finite differences, fast kernels
//! against the reference.
use super::*;
use crate::testutil::*;

const N: usize = 7;
const C: usize = 5;
const V: usize = 11;

#[test]
fn backward_matches_finite_differences() {
    let mut rng = Rng::new(14);
    let inp: Vec<f64> = rng.vec(N * C).iter().map(|x| 2.0 * x).collect();
    let wte = rng.vec(V * C);
    let targets: Vec<u32> = (0..N).map(|_| rng.below(V as u32)).collect();
    let dloss = 1.0 / N as f64;
    let loss = |inp: &[f64], wte: &[f64]| {
        let (mut di, mut dw) = (vec![0.0; N * C], vec![0.0; V * C]);
        dloss * reference::forward_backward(&mut di, &mut dw, inp, wte, &targets, N, C, V, dloss)
    };
    let fd_inp = fd_grad(&inp, |x| loss(x, &wte));
    let fd_wte = fd_grad(&wte, |w| loss(&inp, w));
    let (mut di, mut dw) = (vec![0.0; N * C], vec![0.0; V * C]);
    let total = reference::forward_backward(&mut di, &mut dw, &inp, &wte, &targets, N, C, V, dloss);
    assert_close("dinp f64", &di, &fd_inp, FD_TOL_F64);
    assert_close("dwte f64", &dw, &fd_wte, FD_TOL_F64);

    // Chunks of 3 rows: 7 = 3 + 3 + 1 exercises the partial last chunk.
    let (i32_, w32) = (to_f32(&inp), to_f32(&wte));
    let (mut losses, mut di32, mut dw32) =
        (vec![0.0f32; N], vec![0.0f32; N * C], vec![0.0f32; V * C]);
    let mut scratch = vec![0.0f32; 3 * V];
    let io = Io::new(
        &mut losses,
        &mut di32,
        Some(&mut dw32),
        &i32_,
        &w32,
        &targets,
        &mut scratch,
    );
    let sum = forward_backward(io, (N, C, V), dloss as f32);
    assert_close("sum of losses", &[sum as f64], &[total], F32_TOL);
    assert_close_f32("dinp f32", &di32, &fd_inp, F32_TOL);
    assert_close_f32("dwte f32", &dw32, &fd_wte, F32_TOL);

    let mut losses2 = vec![0.0f32; N];
    let sum2 = super::loss(&mut losses2, &i32_, &w32, &targets, &mut scratch, (N, C, V));
    assert_eq!(
        (sum2, &losses2),
        (sum, &losses),
        "loss alone must equal the fused forward"
    );
    let mut row = vec![0.0f32; V];
    logits(&mut row, &i32_[..C], &w32, C, V);
    let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
    assert_close(
        "row 0 loss from logits",
        &[lse - row[targets[0] as usize] as f64],
        &[losses[0] as f64],
        F32_TOL,
    );
}

#[test]
#[should_panic(expected = "beyond vocabulary")]
fn target_beyond_vocabulary_panics() {
    let mut scratch = vec![0.0f32; V];
    super::loss(
        &mut [0.0],
        &[0.0; C],
        &[0.0; V * C],
        &[V as u32],
        &mut scratch,
        (1, C, V),
    );
}

/// Largest |got - want| within `tol` of the largest |want| (gradients are dloss-sized, far below
/// the absolute floor of `assert_close`); `want` must not be all zeros.
#[track_caller]
fn assert_close_rel(what: &str, got: &[f32], want: &[f64], tol: f64) {
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{what}: the reference is all zeros");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let diff = (g as f64 - w).abs();
        assert!(
            diff <= tol * scale,
            "{what}[{i}]: got {g}, want {w} (scale {scale})"
        );
    }
}

/// The bf16 classifier against the f64 reference on the same bf16 values of the input and the
/// table: V over one softmax block (1024 rows) and past the GEMMs' packed and dot-product
/// thresholds, 7 rows in chunks of 3 (a partial last chunk). Losses agree to f32 rounding; the
/// gradients carry dl's bf16 rounding (2^-9 relative per element), the 2-byte table gradient
/// also one rounding per chunk.
#[test]
fn bf16_matches_reference_on_bf16_values() {
    use crate::classifier::bf16 as cls;
    use half::bf16;
    let (n, c, v) = (7, 40, 1100);
    let mut rng = Rng::new(15);
    let round = |x: &[f64]| -> Vec<bf16> { x.iter().map(|&y| bf16::from_f64(y)).collect() };
    let inp = rng.vec(n * c);
    let wte_h = round(&rng.vec(v * c));
    let targets: Vec<u32> = (0..n).map(|_| rng.below(v as u32)).collect();
    let wide = |x: &[bf16]| -> Vec<f64> { x.iter().map(|y| y.to_f64()).collect() };
    let (inp_r, wte_r) = (wide(&round(&inp)), wide(&wte_h));
    let dloss = 1.0 / n as f64;
    let (mut di, mut dw) = (vec![0.0; n * c], vec![0.0; v * c]);
    let total =
        reference::forward_backward(&mut di, &mut dw, &inp_r, &wte_r, &targets, n, c, v, dloss);

    // Three rows of scratch, in u32 words for the 4-byte alignment the kernel asks for.
    let rows = 3;
    let mut words = vec![0u32; rows * cls::scratch_bytes_per_row(c, v) / 4];
    // SAFETY: u32 and bf16 have no invalid bit patterns; the view covers exactly the words.
    let scratch: &mut [bf16] =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 2 * words.len()) };
    assert_eq!(cls::scratch_rows(scratch, c, v), rows);
    let (mut losses, mut di32, mut dw16) = (
        vec![0.0f32; n],
        vec![0.0f32; n * c],
        vec![bf16::ZERO; v * c],
    );
    let inp32 = to_f32(&inp);
    let io = Io::new(
        &mut losses,
        &mut di32,
        Some(&mut dw16),
        &inp32,
        &wte_h,
        &targets,
        scratch,
    );
    let sum = cls::forward_backward(io, (n, c, v), dloss as f32, None);
    assert_close("sum of losses", &[sum as f64], &[total], F32_TOL);
    assert_close_rel("dinp bf16", &di32, &di, 1e-2);
    let dw32: Vec<f32> = dw16.iter().map(|x| x.to_f32()).collect();
    assert_close_rel("dwte bf16", &dw32, &dw, 1e-2);

    // The forward-only logits of the first chunk give the fused pass's losses.
    cls::logits(scratch, &to_f32(&inp[..rows * c]), &wte_h, rows, c, v);
    // SAFETY: the first rows·V f32 of the 4-byte aligned scratch (as the kernel reads them).
    let lg: &[f32] = unsafe { std::slice::from_raw_parts(scratch.as_ptr().cast(), rows * v) };
    for r in 0..rows {
        let row = &lg[r * v..(r + 1) * v];
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let want = lse - row[targets[r] as usize] as f64;
        assert_close("loss from logits", &[losses[r] as f64], &[want], F32_TOL);
    }
}

/// A 4-byte aligned bf16 scratch of `rows` chunk rows for the bf16 classifier.
fn bf16_scratch(rows: usize, c: usize, v: usize) -> Vec<u32> {
    vec![0u32; rows * super::bf16::scratch_bytes_per_row(c, v) / 4]
}

fn as_bf16(words: &mut [u32]) -> &mut [half::bf16] {
    // SAFETY: u32 and bf16 have no invalid bit patterns; the view covers exactly the words.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 2 * words.len()) }
}

/// Runs `rank(r, first, rows, reduce)` for each of two vocabulary shards, ranks as threads and
/// the reductions through shared slots; returns each rank's result.
fn on_two_shards<T: Send>(
    shards: [(usize, usize); 2],
    rank: impl Fn(usize, usize, usize, &mut dyn FnMut(&mut [f32], shard::RowReduce)) -> T + Sync,
) -> Vec<T> {
    let ranks = TwoRanks::new();
    std::thread::scope(|s| {
        let joins: Vec<_> = (shards.iter().enumerate())
            .map(|(r, &(first, rows))| {
                let (ranks, rank) = (&ranks, &rank);
                s.spawn(move || rank(r, first, rows, &mut |buf, op| ranks.reduce(r, buf, op)))
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// A classifier's outputs for `n` rows of width `c` against `v` table rows, zeroed.
struct Outs<W> {
    losses: Vec<f32>,
    dinp: Vec<f32>,
    dwte: Vec<W>,
}

impl<W: Default + Clone> Outs<W> {
    fn new(n: usize, c: usize, v: usize) -> Self {
        let (losses, dinp) = (vec![0.0; n], vec![0.0; n * c]);
        let dwte = vec![W::default(); v * c];
        Outs { losses, dinp, dwte }
    }

    fn io<'a>(
        &'a mut self,
        inp: &'a [f32],
        wte: &'a [W],
        y: &'a [u32],
        s: &'a mut [W],
    ) -> Io<'a, W> {
        let dw = Some(&mut self.dwte[..]);
        Io::new(&mut self.losses, &mut self.dinp, dw, inp, wte, y, s)
    }
}

/// One shard's result: the sum of the losses, the losses, its partial dinp and its dwte rows.
type ShardResult<W> = (f32, Vec<f32>, Vec<f32>, Vec<W>);

/// Checks each shard's sum and losses against the whole classifier's; returns dinp summed over
/// the shards and dwte concatenated (widened to f32).
fn combine<W: Copy + Into<f32>>(
    results: &[ShardResult<W>],
    whole: f32,
    losses: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-3);
    for (sum, l, _, _) in results {
        assert!(rel(*sum, whole) < 1e-5, "{sum} vs {whole}");
        (l.iter().zip(losses)).for_each(|(a, b)| assert!(rel(*a, *b) < 1e-5));
    }
    let dinp_sum = (results[0].2.iter().zip(&results[1].2))
        .map(|(a, b)| a + b)
        .collect();
    let dwte_cat = (results.iter().flat_map(|r| &r.3))
        .map(|&x| x.into())
        .collect();
    (dinp_sum, dwte_cat)
}

/// Two vocabulary shards of the f32 classifier give the whole classifier's losses, input
/// gradient (summed) and table gradient (concatenated).
#[test]
fn two_vocabulary_shards_give_the_whole_classifiers_loss_and_gradients() {
    let (n, c, v, chunk) = (37, 8, 29, 16);
    let mut rng = Rng::new(3);
    let inp = to_f32(&rng.vec(n * c));
    let wte = to_f32(&rng.vec(v * c));
    let targets: Vec<u32> = (0..n).map(|_| rng.below(v as u32)).collect();
    let dloss = 1.0 / n as f32;
    let mut all = Outs::new(n, c, v);
    let mut scratch = vec![0.0; chunk * v];
    let whole = forward_backward(all.io(&inp, &wte, &targets, &mut scratch), (n, c, v), dloss);
    let results = on_two_shards([(0, 15), (15, 14)], |_, first, rows, reduce| {
        let (mut mine, mut scratch) = (Outs::new(n, c, rows), vec![0.0; chunk * rows]);
        let mut stats = vec![0.0; 3 * chunk];
        let wte = &wte[first * c..(first + rows) * c];
        let io = mine.io(&inp, wte, &targets, &mut scratch);
        let shard = VocabShard {
            first,
            stats: &mut stats,
            reduce,
        };
        let sum = shard::forward_backward(io, (n, c, rows), dloss, shard);
        (sum, mine.losses, mine.dinp, mine.dwte)
    });
    let (losses, dinp, dwte) = (all.losses, all.dinp, all.dwte);
    let (dinp_sum, dwte_cat) = combine(&results, whole, &losses);
    assert_close("dinp", &to_f64(&dinp_sum), &to_f64(&dinp), 1e-5);
    assert_close("dwte", &to_f64(&dwte_cat), &to_f64(&dwte), 1e-5);
}

/// Two vocabulary shards of the bf16 classifier give the whole bf16 classifier's losses, input
/// gradient (summed) and table gradient (concatenated): the shards see the same bf16 logits, and
/// their lse differs only in summation order (so a 2-byte table gradient may round one bf16 step
/// apart: 2^-8 of the largest).
#[test]
fn two_bf16_vocabulary_shards_give_the_whole_bf16_classifier() {
    use half::bf16;
    let (n, c, v, chunk) = (37, 24, 1100, 16);
    let mut rng = Rng::new(16);
    let inp = to_f32(&rng.vec(n * c));
    let wte: Vec<bf16> = rng.vec(v * c).iter().map(|&x| bf16::from_f64(x)).collect();
    let targets: Vec<u32> = (0..n).map(|_| rng.below(v as u32)).collect();
    let dloss = 1.0 / n as f32;
    let mut all = Outs::new(n, c, v);
    let mut words = bf16_scratch(chunk, c, v);
    let io = all.io(&inp, &wte, &targets, as_bf16(&mut words));
    let whole = super::bf16::forward_backward(io, (n, c, v), dloss, None);
    let results = on_two_shards([(0, 600), (600, 500)], |_, first, rows, reduce| {
        let mut mine = Outs::new(n, c, rows);
        let (mut words, mut stats) = (bf16_scratch(chunk, c, rows), vec![0.0; 3 * chunk]);
        let wte = &wte[first * c..(first + rows) * c];
        let io = mine.io(&inp, wte, &targets, as_bf16(&mut words));
        let shard = VocabShard {
            first,
            stats: &mut stats,
            reduce,
        };
        let sum = super::bf16::forward_backward(io, (n, c, rows), dloss, Some(shard));
        (sum, mine.losses, mine.dinp, mine.dwte)
    });
    let (losses, dinp, dwte) = (all.losses, all.dinp, all.dwte);
    let (dinp_sum, dwte_cat) = combine(&results, whole, &losses);
    let wide = |x: &[bf16]| -> Vec<f32> { x.iter().map(|y| y.to_f32()).collect() };
    assert_close_rel("dinp", &dinp_sum, &to_f64(&dinp), 1e-3);
    assert_close_rel("dwte", &dwte_cat, &to_f64(&wide(&dwte)), 4e-3);
}
