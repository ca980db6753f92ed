//! The classic worked examples of the number formats reproduced exactly: π in fp32, 3.14 in
//! fp16 and bf16, the FP32/FP16/BF16 properties table, and 4.125 bits per weight for int4 g128.

// The classic example value is 3.14 itself, not an approximation of π.
#![allow(clippy::approx_constant)]

use formats::quant::{bits_per_weight, StorageSpec};
use formats::{explain, BitFields, Format};

fn fields(format: Format, x: f64) -> String {
    explain(format, x).unwrap().fields.joined(" ")
}

#[test]
fn pi_in_fp32() {
    let e = explain(Format::F32, std::f64::consts::PI).unwrap();
    assert_eq!(e.fields.joined(" "), "0 10000000 10010010000111111011011");
    assert_eq!(
        (e.sign, e.exponent_raw, e.bias),
        (Some(0), Some(128), Some(127))
    );
    assert_eq!(e.decoded, 3.1415927410125732);
    assert_eq!(
        e.formula,
        "(-1)^0 × 2^(128-127) × (1 + 4788187/2^23) = 2^1 × 1.5707963705062866 = 3.1415927410125732"
    );
    // |π - π_fp32| = 8.74e-8.
    assert!((e.abs_error.unwrap() - 8.742278e-8).abs() < 1e-13);
}

#[test]
fn three_point_one_four_in_fp16_and_bf16() {
    assert_eq!(fields(Format::F16, 3.14), "0 10000 1001001000");
    assert_eq!(fields(Format::Bf16, 3.14), "0 10000000 1001001");
    let h = explain(Format::F16, 3.14).unwrap();
    assert_eq!(
        (h.exponent_raw, h.bias, h.decoded),
        (Some(16), Some(15), 3.140625)
    );
    let b = explain(Format::Bf16, 3.14).unwrap();
    assert_eq!(
        (b.exponent_raw, b.bias, b.decoded),
        (Some(128), Some(127), 3.140625)
    );
    // Both land on 2 × 1.5703125: 1.57's fraction rounds to 73/2^7 = 584/2^10 in either width.
    assert_eq!(
        explain(Format::Bf16, std::f64::consts::PI).unwrap().decoded,
        3.140625
    );
    assert_eq!(
        explain(Format::F16, std::f64::consts::PI).unwrap().decoded,
        3.140625
    );
}

#[test]
fn subnormal_zero_inf_and_nan_explanations() {
    let tiny = explain(Format::F16, 2f64.powi(-24)).unwrap();
    assert_eq!(tiny.fields.joined(" "), "0 00000 0000000001");
    assert!(
        tiny.formula.starts_with("(-1)^0 × 2^(1-15) × (0 + 1/2^10)"),
        "{}",
        tiny.formula
    );
    assert_eq!(fields(Format::Bf16, -0.0), "1 00000000 0000000");
    let big = explain(Format::F16, 1e6).unwrap();
    assert_eq!(big.decoded, f64::INFINITY);
    assert!(big.out_of_range.is_some());
    let sat = explain(Format::Fp8E4M3, 1000.0).unwrap();
    assert_eq!(
        (sat.fields.joined(" "), sat.decoded),
        ("0 1111 110".to_string(), 448.0)
    );
    assert!(sat.out_of_range.unwrap().contains("satfinite"));
    assert_eq!(fields(Format::Fp8E4M3, f64::NAN), "0 1111 111");
    let int = explain(Format::Int8, -3.5).unwrap();
    assert!(matches!(int.fields, BitFields::Code { ref code } if code == "11111100"));
    assert_eq!(int.decoded, -4.0);
    assert!(explain(Format::Int4, f64::NAN).is_err());
}

#[test]
fn the_seed_properties_table() {
    let row = |f: Format| f.properties();
    let (s, h, b) = (row(Format::F32), row(Format::F16), row(Format::Bf16));
    assert_eq!(
        (s.bits, s.exponent_bits, s.mantissa_bits),
        (32, Some(8), Some(23))
    );
    assert_eq!(
        (h.bits, h.exponent_bits, h.mantissa_bits),
        (16, Some(5), Some(10))
    );
    assert_eq!(
        (b.bits, b.exponent_bits, b.mantissa_bits),
        (16, Some(8), Some(7))
    );
    // 动态范围 ±3.4×10³⁸ / ±65504 / ±3.4×10³⁸.
    assert_eq!(h.max, 65504.0);
    assert!((s.max / 3.4e38 - 1.0).abs() < 0.01 && (b.max / 3.4e38 - 1.0).abs() < 0.01);
    // 最小正数 ~1.2×10⁻³⁸ / ~6.1×10⁻⁵ / ~1.2×10⁻³⁸ (smallest normals).
    assert!((s.smallest_normal.unwrap() / 1.175e-38 - 1.0).abs() < 0.01);
    assert!((h.smallest_normal.unwrap() / 6.1e-5 - 1.0).abs() < 0.01);
    assert_eq!(b.smallest_normal, s.smallest_normal);
    // 精度 ~7 / ~3.3 / ~2.4 decimal digits.
    let digits = |p: &formats::Properties| (p.decimal_digits.unwrap() * 10.0).round() / 10.0;
    assert_eq!((digits(&s), digits(&h), digits(&b)), (7.2, 3.3, 2.4));
    // fp8: OCP e4m3 max 448 without infinities, e5m2 max 57344 with them.
    let (e4, e5) = (row(Format::Fp8E4M3), row(Format::Fp8E5M2));
    assert_eq!((e4.max, e4.has_inf, e4.bias), (448.0, false, Some(7)));
    assert_eq!((e5.max, e5.has_inf, e5.bias), (57344.0, true, Some(15)));
    assert_eq!(
        (row(Format::Int8).min, row(Format::Int8).max),
        (-128.0, 127.0)
    );
    assert_eq!(row(Format::Nf4).bits, 4);
}

#[test]
fn int4_group128_fp16_symmetric_is_4_125_bits_per_weight() {
    assert_eq!(bits_per_weight(&StorageSpec::int4_g128()), 4.125);
}
