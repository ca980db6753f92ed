//! Error bounds of the parent module's `exp` and `tanh` against f64, over dense sweeps, with and
//! without FMA; the measured worst cases are printed (`cargo test -- --nocapture`).
use super::*;

/// Every 97th f32 bit pattern between `lo` and `hi` (both signs handled by the caller), plus the
/// end: up to ~10^7 points per call, spread evenly in ulps rather than in value.
fn sweep(lo: f32, hi: f32) -> impl Iterator<Item = f32> {
    assert!(0.0 <= lo && lo < hi);
    (lo.to_bits()..=hi.to_bits())
        .step_by(97)
        .chain([hi.to_bits()])
        .map(f32::from_bits)
}

/// Worst relative error of `f` against `exact` over both signs of the sweep.
fn worst_rel(f: impl Fn(f32) -> f32, exact: impl Fn(f64) -> f64, lo: f32, hi: f32) -> (f64, f32) {
    let mut worst = (0.0f64, 0.0f32);
    for a in sweep(lo, hi) {
        for x in [a, -a] {
            let (got, want) = (f(x) as f64, exact(x as f64));
            let rel = if want == 0.0 {
                got.abs()
            } else {
                ((got - want) / want).abs()
            };
            if rel > worst.0 {
                worst = (rel, x);
            }
        }
    }
    worst
}

#[test]
fn exp_within_two_ulp_of_f64() {
    for (name, f) in [
        ("no fma", exp_with::<false> as fn(f32) -> f32),
        ("fma", exp_with::<true>),
    ] {
        // Both signs of [0, 87.33]: the whole normal range of results.
        let (rel, at) = worst_rel(f, f64::exp, 0.0, 87.3);
        println!("exp ({name}): worst relative error {rel:.3e} at x = {at}");
        assert!(rel <= 2.0 * f32::EPSILON as f64, "{name}: {rel:e} at {at}");
        // The top of the range, positive side only (below EXP_LO the result is 0 by design).
        for x in sweep(87.3, EXP_HI) {
            let rel = (f(x) as f64 / (x as f64).exp() - 1.0).abs();
            assert!(
                rel <= 2.0 * f32::EPSILON as f64,
                "{name} top: {rel:e} at {x}"
            );
        }
    }
}

#[test]
fn exp_edges() {
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-100.0), 0.0);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp(100.0), f32::INFINITY);
    assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    assert!(exp(f32::NAN).is_nan());
    assert!(exp_with::<true>(f32::NAN).is_nan());
}

#[test]
fn tanh_within_1_5e7_of_f64() {
    for (name, f) in [
        ("no fma", tanh_with::<false> as fn(f32) -> f32),
        ("fma", tanh_with::<true>),
    ] {
        // Relative error over [1e-30, 12] (relative implies absolute since |tanh| <= 1).
        let (rel, at) = worst_rel(f, f64::tanh, 1e-30, 12.0);
        println!("tanh ({name}): worst relative error {rel:.3e} at x = {at}");
        assert!(rel <= 1.5e-7, "{name}: {rel:e} at {at}");
    }
}

#[test]
fn tanh_edges() {
    assert_eq!(tanh(0.0), 0.0);
    assert_eq!(tanh(100.0), 1.0);
    assert_eq!(tanh(-100.0), -1.0);
    assert_eq!(tanh(f32::INFINITY), 1.0);
    assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    assert!(tanh(f32::NAN).is_nan());
    assert!((-20_000..20_000).all(|i| tanh(i as f32 * 1e-3).abs() <= 1.0));
}

simd_fn! {
    /// Dispatched `exp` over a slice, to check the widened paths agree with the scalar one.
    fn exp_slice(out: &mut [f32], inp: &[f32]) = exp_slice_body;
}

#[inline(always)]
fn exp_slice_body<const FMA: bool>(out: &mut [f32], inp: &[f32]) {
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = exp_with::<FMA>(x);
    }
}

#[test]
fn dispatched_loop_matches_scalar() {
    let inp: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.19).collect();
    let mut out = vec![0.0f32; inp.len()];
    exp_slice(&mut out, &inp);
    let fma = simd() != Simd::Base;
    for (&o, &x) in out.iter().zip(&inp) {
        let want = if fma { exp_with::<true>(x) } else { exp(x) };
        assert_eq!(o, want, "x = {x} on {:?}", simd());
    }
}
