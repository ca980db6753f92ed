//! Every bit pattern of fp16, bf16 (2^16 each) and both fp8 formats (2^8 each): decoding equals an
//! f64 reference written independently here (and the `half` crate for fp16/bf16), and encoding the
//! decoded value gives the same pattern back (NaN stays NaN).

use formats::{Class, FloatLayout, Format};

/// Reference decode straight from the textbook definition, by integer arithmetic on the fields:
/// normal = (2^M + m) · 2^(e - bias - M), subnormal = m · 2^(1 - bias - M).
fn reference(bits: u32, e_bits: u32, m_bits: u32, ieee: bool) -> f64 {
    let sign = if bits >> (e_bits + m_bits) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let e = (bits >> m_bits) & ((1 << e_bits) - 1);
    let m = bits & ((1 << m_bits) - 1);
    let bias = (1i32 << (e_bits - 1)) - 1;
    let all_ones = (1 << e_bits) - 1;
    if ieee && e == all_ones {
        return if m == 0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if !ieee && e == all_ones && m == (1 << m_bits) - 1 {
        return f64::NAN;
    }
    let (int, exp) = if e == 0 {
        (m as f64, 1 - bias - m_bits as i32)
    } else {
        (((1 << m_bits) + m) as f64, e as i32 - bias - m_bits as i32)
    };
    sign * int * 2f64.powi(exp)
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn check_all(layout: FloatLayout, ieee: bool, oracle: Option<&dyn Fn(u32) -> f64>) {
    let n = 1u32 << layout.bits();
    for bits in 0..n {
        let got = layout.decode(bits);
        let want = reference(bits, layout.exponent_bits, layout.mantissa_bits, ieee);
        assert!(
            same(got, want),
            "{bits:#x}: decoded {got:e}, reference {want:e}"
        );
        if let Some(oracle) = oracle {
            let o = oracle(bits);
            assert!(same(got, o), "{bits:#x}: decoded {got:e}, half says {o:e}");
        }
        let back = layout.encode(got);
        if got.is_nan() {
            assert_eq!(
                layout.classify(back),
                Class::Nan,
                "{bits:#x}: NaN must stay NaN"
            );
        } else {
            assert_eq!(back, bits, "{bits:#x} ({got:e}) encoded back as {back:#x}");
        }
    }
}

#[test]
fn all_fp16_patterns() {
    check_all(
        FloatLayout::FP16,
        true,
        Some(&|b| half::f16::from_bits(b as u16).to_f64()),
    );
}

#[test]
fn all_bf16_patterns() {
    check_all(
        FloatLayout::BF16,
        true,
        Some(&|b| half::bf16::from_bits(b as u16).to_f64()),
    );
}

#[test]
fn all_fp8_e5m2_patterns() {
    check_all(FloatLayout::FP8_E5M2, true, None);
}

#[test]
fn all_fp8_e4m3_patterns() {
    check_all(FloatLayout::FP8_E4M3, false, None);
}

#[test]
fn fp8_landmarks_from_the_ocp_spec() {
    let e4m3 = Format::Fp8E4M3;
    assert_eq!(e4m3.decode(0x7E), 448.0);
    assert_eq!(e4m3.decode(0xFE), -448.0);
    assert!(e4m3.decode(0x7F).is_nan() && e4m3.decode(0xFF).is_nan());
    assert_eq!(e4m3.decode(0x78), 256.0, "S.1111.000 is finite in e4m3");
    assert_eq!(e4m3.decode(0x08), 2f64.powi(-6), "smallest normal");
    assert_eq!(e4m3.decode(0x01), 2f64.powi(-9), "smallest subnormal");
    let e5m2 = Format::Fp8E5M2;
    assert_eq!(e5m2.decode(0x7B), 57344.0);
    assert_eq!(e5m2.decode(0x7C), f64::INFINITY);
    assert_eq!(e5m2.decode(0xFC), f64::NEG_INFINITY);
    assert!((0x7D..=0x7F).all(|b| e5m2.decode(b).is_nan()));
    assert_eq!(e5m2.decode(0x04), 2f64.powi(-14));
    assert_eq!(e5m2.decode(0x01), 2f64.powi(-16));
    // Counts of distinct positive finite values: e4m3 0x01..=0x7E, e5m2 0x01..=0x7B.
    let count = |f: Format| {
        (1..0x80)
            .filter(|&b| f.decode(b).is_finite() && f.decode(b) > 0.0)
            .count()
    };
    assert_eq!((count(e4m3), count(e5m2)), (126, 123));
}

#[test]
fn fp32_patterns_sampled() {
    // 2^32 is too many for a quick test: walk a stride that is prime so every field is hit.
    let layout = FloatLayout::FP32;
    let mut bits: u32 = 0;
    for _ in 0..2_000_000 {
        let got = layout.decode(bits);
        let want = f32::from_bits(bits) as f64;
        assert!(
            same(got, want),
            "{bits:#x}: decoded {got:e}, f32 says {want:e}"
        );
        if !got.is_nan() {
            assert_eq!(layout.encode(got), bits);
        }
        bits = bits.wrapping_add(2_147_483_647 / 1_000_003);
    }
}
