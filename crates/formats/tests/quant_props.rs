//! Property tests of quantization (proptest): int round trips land within scale/2, asymmetric
//! keeps zero exact, nf4 and fp8 stay within their level spacing; plus the typed bad-input errors.

use formats::quant::{quantize, Granularity, QuantConfig, Scheme, Symmetry};
use formats::{Format, QuantError, NF4_LEVELS};
use proptest::prelude::*;

/// rows × cols with cols a multiple of 4, values in ±range (range itself spans many binades, up
/// to 2^14 so that every scheme's scale fits in fp16; beyond is a typed error, tested below).
fn matrix() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..4, 1usize..9, -20i32..15).prop_flat_map(|(rows, cols4, exp)| {
        let cols = cols4 * 4;
        let range = 2f32.powi(exp);
        let values = prop::collection::vec(-range..range, rows * cols);
        (Just(rows), Just(cols), values)
    })
}

fn granularity() -> impl Strategy<Value = Granularity> {
    prop_oneof![
        Just(Granularity::PerTensor),
        Just(Granularity::PerChannel),
        Just(Granularity::PerGroup(4)),
        Just(Granularity::PerGroup(2)),
    ]
}

fn config(scheme: Scheme, granularity: Granularity, symmetry: Symmetry) -> QuantConfig {
    QuantConfig {
        scheme,
        granularity,
        symmetry,
        scale_format: Format::F16,
    }
}

/// The dequantized value is an f64 product rounded to f32: allow that one rounding (2^-24
/// relative) on top of the quantization bound.
fn f32_slack(x: f32) -> f64 {
    x.abs() as f64 * 2f64.powi(-23) + 1e-45
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn int_round_trip_within_half_a_scale(
        (rows, cols, data) in matrix(),
        granularity in granularity(),
        scheme in prop_oneof![Just(Scheme::Int8), Just(Scheme::Int4)],
        symmetry in prop_oneof![Just(Symmetry::Symmetric), Just(Symmetry::Asymmetric)],
    ) {
        let q = quantize(&data, rows, cols, &config(scheme, granularity, symmetry)).unwrap();
        let back = q.dequantize();
        for (i, (&x, &y)) in data.iter().zip(&back).enumerate() {
            let scale = q.scales[i / q.group_size];
            let err = (x as f64 - y as f64).abs();
            prop_assert!(err <= scale / 2.0 + f32_slack(x),
                "element {i}: {x} → {y}, error {err:e} > scale/2 = {:e}", scale / 2.0);
        }
    }

    #[test]
    fn asymmetric_keeps_zero_exact(
        (rows, cols, mut data) in matrix(),
        granularity in granularity(),
        scheme in prop_oneof![Just(Scheme::Int8), Just(Scheme::Int4)],
        zero_at in 0usize..1000,
    ) {
        let idx = zero_at % data.len();
        data[idx] = 0.0;
        let q = quantize(&data, rows, cols, &config(scheme, granularity, Symmetry::Asymmetric))
            .unwrap();
        prop_assert_eq!(q.dequantize()[idx], 0.0);
    }

    #[test]
    fn nf4_error_within_half_the_widest_level_gap(
        (rows, cols, data) in matrix(),
        granularity in granularity(),
    ) {
        let q = quantize(&data, rows, cols, &config(Scheme::Nf4, granularity, Symmetry::Symmetric))
            .unwrap();
        let widest_gap = NF4_LEVELS.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        for (i, (&x, &y)) in data.iter().zip(&q.dequantize()).enumerate() {
            let scale = q.scales[i / q.group_size];
            let err = (x as f64 - y as f64).abs();
            prop_assert!(err <= scale * widest_gap / 2.0 + f32_slack(x), "element {i}: {x} → {y}");
        }
    }

    #[test]
    fn fp8_error_within_half_an_ulp(
        (rows, cols, data) in matrix(),
        granularity in granularity(),
        scheme in prop_oneof![Just(Scheme::Fp8E4M3), Just(Scheme::Fp8E5M2)],
    ) {
        let q = quantize(&data, rows, cols, &config(scheme, granularity, Symmetry::Symmetric))
            .unwrap();
        let layout = Format::from(scheme).layout().unwrap();
        for (i, (&x, &y)) in data.iter().zip(&q.dequantize()).enumerate() {
            let scale = q.scales[i / q.group_size];
            let scaled = (x as f64 / scale).abs();
            // Half an ulp at the scaled value's binade (subnormal spacing below the normals).
            let binade = scaled.max(layout.smallest_normal()).log2().floor();
            let half_ulp = 2f64.powf(binade) * layout.epsilon() / 2.0 * scale;
            let err = (x as f64 - y as f64).abs();
            prop_assert!(err <= half_ulp + f32_slack(x), "element {i}: {x} → {y}, {err:e} > {half_ulp:e}");
        }
    }
}

#[test]
fn nan_and_inf_are_refused_with_the_first_bad_index() {
    let mut data = vec![0.5f32; 16];
    data[9] = f32::INFINITY;
    data[13] = f32::NAN;
    let mut cfg = QuantConfig::new(Scheme::Int8);
    cfg.granularity = Granularity::PerChannel;
    let err = quantize(&data, 2, 8, &cfg).unwrap_err();
    assert_eq!(
        err,
        QuantError::NonFinite {
            index: 9,
            row: 1,
            col: 1,
            value: f32::INFINITY
        }
    );
    assert!(
        err.to_string()
            .contains("element 9 (row 1, column 1) is inf"),
        "{err}"
    );
}

#[test]
fn group_not_dividing_the_row_names_both_numbers_and_a_fix() {
    let data = vec![1.0f32; 200];
    let err = quantize(&data, 2, 100, &QuantConfig::new(Scheme::Int4)).unwrap_err();
    assert_eq!(
        err,
        QuantError::GroupDoesNotDivide {
            group_size: 128,
            row_len: 100,
            suggestion: 100
        }
    );
    let text = err.to_string();
    assert!(text.contains("128") && text.contains("100"), "{text}");
}

#[test]
fn other_bad_configs_are_typed_errors() {
    let data = vec![1.0f32; 8];
    let mut cfg = QuantConfig::new(Scheme::Nf4);
    cfg.granularity = Granularity::PerChannel;
    cfg.symmetry = Symmetry::Asymmetric;
    assert!(matches!(
        quantize(&data, 1, 8, &cfg),
        Err(QuantError::AsymmetricUnsupported { .. })
    ));
    cfg.symmetry = Symmetry::Symmetric;
    cfg.scale_format = Format::Int8;
    assert!(matches!(
        quantize(&data, 1, 8, &cfg),
        Err(QuantError::ScaleFormatNotFloat { .. })
    ));
    assert!(matches!(
        quantize(&data, 3, 8, &QuantConfig::new(Scheme::Int8)),
        Err(QuantError::ShapeMismatch { .. })
    ));
    // fp8-e4m3 scales top out at 448: a group needing a larger scale is an error, not an inf.
    cfg.scale_format = Format::Fp8E4M3;
    let big = vec![1e6f32; 8];
    assert!(matches!(
        quantize(&big, 1, 8, &cfg),
        Err(QuantError::ScaleOutOfRange { .. })
    ));
}

#[test]
fn all_zero_group_decodes_to_zeros_and_sizes_add_up() {
    let mut data = vec![0.0f32; 256];
    data[200] = 3.0;
    let q = quantize(&data, 2, 128, &QuantConfig::new(Scheme::Int4)).unwrap();
    assert_eq!(q.scales[0], 0.0);
    assert_eq!(q.dequantize()[..128], [0.0; 128]);
    // 256 int4 codes (128 bytes) + 2 fp16 scales (4 bytes).
    assert_eq!(q.stored_bytes(), 132);
    assert_eq!(q.bits_per_weight(), 4.125);
}

/// Inverse of the standard normal CDF (Acklam's rational approximation, relative error 1.15e-9).
// The published coefficients are kept digit for digit.
#[allow(clippy::excessive_precision)]
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383577518672690e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[test]
fn nf4_levels_are_the_normal_quantiles_of_qlora() {
    // bitsandbytes' create_normal_map(offset = 0.9677083): 8 positive quantiles at
    // linspace(offset, 0.5, 9)[:-1], 7 negative at linspace(offset, 0.5, 8)[:-1], and 0,
    // normalised by the largest. bitsandbytes computes in float32, so allow 1e-6.
    let offset = 0.9677083;
    let lin = |n: usize, i: usize| offset + (0.5 - offset) * i as f64 / (n - 1) as f64;
    let mut levels: Vec<f64> = (0..8).map(|i| normal_quantile(lin(9, i))).collect();
    levels.extend((0..7).map(|i| -normal_quantile(lin(8, i))));
    levels.push(0.0);
    let top = normal_quantile(offset);
    levels.iter_mut().for_each(|v| *v /= top);
    levels.sort_by(f64::total_cmp);
    for (derived, shipped) in levels.iter().zip(NF4_LEVELS) {
        assert!(
            (derived - shipped).abs() < 1e-6,
            "derived {derived}, shipped {shipped}"
        );
    }
}
