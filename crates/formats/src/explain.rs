//! Explanations of one value's bits in one format: the sign | exponent | mantissa fields, the
//! raw exponent and bias, the formula (-1)^s × 2^(e-bias) × (1 + m/2^M) with the numbers filled
//! in, the decoded value and its error against the input.
//!
//! Integer and NF4 formats explain their code at scale 1 (scales belong to `quant`). Example:
//! `explain(Format::F32, std::f64::consts::PI)` has fields `0`, `10000000`,
//! `10010010000111111011011` and formula
//! `(-1)^0 × 2^(128-127) × (1 + 4788187/2^23) = 2^1 × 1.5707963705062866 = 3.1415927410125732`.

use crate::{Class, FloatLayout, Format, FormatError, IntRange, Kind};
use serde::Serialize;

/// The bit fields of an encoded value, as strings of 0 and 1.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BitFields {
    Float {
        sign: String,
        exponent: String,
        mantissa: String,
    },
    /// Integer and NF4 codes: one field.
    Code { code: String },
}

impl BitFields {
    /// The fields joined with a separator, e.g. `0 10000 1001001000`.
    pub fn joined(&self, separator: &str) -> String {
        match self {
            BitFields::Float {
                sign,
                exponent,
                mantissa,
            } => [sign.as_str(), exponent, mantissa].join(separator),
            BitFields::Code { code } => code.clone(),
        }
    }
}

/// One value encoded in one format, explained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    pub format: Format,
    pub input: f64,
    pub bits: u32,
    pub hex: String,
    pub fields: BitFields,
    /// Float formats only: the kind of number, raw fields and bias.
    pub class: Option<Class>,
    pub sign: Option<u32>,
    pub exponent_raw: Option<u32>,
    pub mantissa_raw: Option<u32>,
    pub bias: Option<i32>,
    /// The formula with the numbers filled in.
    pub formula: String,
    pub decoded: f64,
    /// |decoded - input|; `None` when either is not finite.
    pub abs_error: Option<f64>,
    /// abs_error / |input|; `None` when the input is 0 or either side is not finite.
    pub rel_error: Option<f64>,
    /// Set when the input lay beyond the finite range: overflowed to ±inf or saturated to ±max.
    pub out_of_range: Option<String>,
}

/// Encodes `x` in `format` and explains the result. Fails only for NaN in integer/NF4 formats.
pub fn explain(format: Format, x: f64) -> Result<Explanation, FormatError> {
    let bits = format.encode(x)?;
    let decoded = format.decode(bits);
    let hex_digits = format.bits().div_ceil(4) as usize;
    let mut out = Explanation {
        format,
        input: x,
        bits,
        hex: format!("0x{bits:0hex_digits$X}"),
        fields: BitFields::Code {
            code: binary(bits, format.bits()),
        },
        class: None,
        sign: None,
        exponent_raw: None,
        mantissa_raw: None,
        bias: None,
        formula: String::new(),
        decoded,
        abs_error: None,
        rel_error: None,
        out_of_range: out_of_range(format, x),
    };
    if x.is_finite() && decoded.is_finite() {
        let abs = (decoded - x).abs();
        out.abs_error = Some(abs);
        out.rel_error = (x != 0.0).then(|| abs / x.abs());
    }
    match format.kind() {
        Kind::Float(layout) => fill_float(&mut out, layout),
        Kind::Int(range) => out.formula = int_formula(range, bits),
        Kind::Lookup(_) => {
            out.formula = format!("code {bits} → NF4 level {decoded} (times the block's absmax)")
        }
    }
    Ok(out)
}

fn fill_float(out: &mut Explanation, layout: FloatLayout) {
    let f = layout.fields(out.bits);
    let (e_bits, m_bits) = (layout.exponent_bits, layout.mantissa_bits);
    out.fields = BitFields::Float {
        sign: binary(f.sign, 1),
        exponent: binary(f.exponent, e_bits),
        mantissa: binary(f.mantissa, m_bits),
    };
    let class = layout.classify(out.bits);
    let bias = layout.bias();
    (out.class, out.bias) = (Some(class), Some(bias));
    (out.sign, out.exponent_raw, out.mantissa_raw) =
        (Some(f.sign), Some(f.exponent), Some(f.mantissa));
    let s = f.sign;
    let (e, m) = (f.exponent as i32, f.mantissa);
    let d = show(out.decoded);
    out.formula = match class {
        Class::Normal => {
            let significand = 1.0 + m as f64 / 2f64.powi(m_bits as i32);
            format!(
                "(-1)^{s} × 2^({e}-{bias}) × (1 + {m}/2^{m_bits}) = {}2^{} × {significand} = {d}",
                if s == 1 { "-" } else { "" },
                e - bias
            )
        }
        Class::Subnormal => {
            format!("(-1)^{s} × 2^(1-{bias}) × (0 + {m}/2^{m_bits}) = {d}   (subnormal: e = 0)")
        }
        Class::Zero => format!("(-1)^{s} × 0 = {d}   (e = 0, m = 0)"),
        Class::Infinite => format!("exponent all ones, mantissa 0 → {d}"),
        Class::Nan if layout.has_inf => "exponent all ones, mantissa ≠ 0 → NaN".to_string(),
        Class::Nan => "S.1111.111 is the only NaN; this format has no infinities".to_string(),
    };
}

fn int_formula(range: IntRange, bits: u32) -> String {
    let code = range.from_bits(bits);
    let how = if range.signed {
        "two's complement"
    } else {
        "unsigned"
    };
    format!(
        "{how} {} = {code}   (round to nearest even, saturate to [{}, {}])",
        binary(bits, range.bits),
        range.min(),
        range.max()
    )
}

/// Says how an input beyond the finite range was handled, per the format's overflow rule.
fn out_of_range(format: Format, x: f64) -> Option<String> {
    if x.is_nan() {
        return None;
    }
    let props = format.properties();
    match format.layout() {
        Some(layout) => {
            let decoded = layout.decode(layout.encode(x));
            if decoded.is_infinite() && x.is_finite() {
                Some(format!(
                    "{x} overflows {format}: rounds to {decoded} (IEEE rule)"
                ))
            } else if layout.overflow == crate::Overflow::Saturate && x.abs() > props.max {
                Some(format!(
                    "{x} is beyond ±{}: saturated (OCP satfinite)",
                    props.max
                ))
            } else {
                None
            }
        }
        None if x > props.max || x < props.min => Some(format!(
            "{x} is outside [{}, {}]: saturated",
            props.min, props.max
        )),
        None => None,
    }
}

/// Plain digits for everyday magnitudes, scientific notation for the very small and large.
fn show(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e16).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

fn binary(value: u32, width: u32) -> String {
    format!("{value:0width$b}", width = width as usize)
}
