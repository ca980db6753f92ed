//! Quantization of a row-major matrix: x_q = round(x / scale) + zero_point, and back
//! x̂ = (x_q - zero_point) × scale, with one scale per tensor, per row ("channel") or per group
//! of g consecutive values in a row.
//!
//! Schemes: int8 and int4 (symmetric: codes in [-(2^(b-1)-1), 2^(b-1)-1], zero point 0;
//! asymmetric: unsigned codes [0, 2^b-1] with a zero point, over a range widened to include 0 so
//! that 0 is exact), nf4 (QLoRA levels times the group's absmax; symmetric only) and fp8 e4m3/e5m2
//! (x / scale encoded in fp8, scale = absmax / fp8 max; symmetric only).
//!
//! Policies, by design:
//! - NaN or ±inf anywhere in the data is refused with [`QuantError::NonFinite`] naming the first
//!   bad index: a scale cannot represent them, and silently zeroing them would hide broken data.
//! - Scales are stored in a float format (fp16 by default) and rounded *up* to it, so no value is
//!   clipped by a scale that rounding made too small; every int element then lies within
//!   scale/2 of its original. A scale beyond the format's range is an error, not an inf.
//! - An all-zero group gets scale 0 and decodes to exact zeros.
//!
//! Example:
//! ```
//! use formats::quant::{quantize, QuantConfig, Scheme};
//! let data: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 100.0).collect();
//! let q = quantize(&data, 2, 128, &QuantConfig::new(Scheme::Int4)).unwrap();
//! assert_eq!(q.bits_per_weight(), 4.125);
//! let back = q.dequantize();
//! assert!((back[0] - data[0]).abs() <= (q.scales[0] / 2.0) as f32);
//! ```

mod metrics;
mod size;

pub use metrics::{ErrorMetrics, ErrorStats};
pub use size::{bits_per_weight, stored_bytes, StorageSpec};

use crate::{nf4_nearest, FloatLayout, Format, FormatError, IntRange, QuantError, NF4_LEVELS};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// What the codes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    Int8,
    Int4,
    Nf4,
    Fp8E4M3,
    Fp8E5M2,
}

/// Whether a zero point shifts the codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Symmetry {
    Symmetric,
    Asymmetric,
}

/// Which values share one scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    PerTensor,
    /// One scale per row.
    PerChannel,
    /// One scale per `g` consecutive values of a row; `g` must divide the row length.
    PerGroup(usize),
}

/// How to quantize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QuantConfig {
    pub scheme: Scheme,
    pub granularity: Granularity,
    pub symmetry: Symmetry,
    pub scale_format: Format,
}

impl QuantConfig {
    /// `scheme`, groups of 128, symmetric, fp16 scales.
    pub fn new(scheme: Scheme) -> QuantConfig {
        QuantConfig {
            scheme,
            granularity: Granularity::PerGroup(128),
            symmetry: Symmetry::Symmetric,
            scale_format: Format::F16,
        }
    }
}

/// A quantized matrix: one code per value (its low `code_bits` bits), and per group a scale
/// (already rounded to the scale format) and, asymmetric, a zero point.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    pub config: QuantConfig,
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f64>,
    /// Empty when symmetric.
    pub zero_points: Vec<i32>,
}

impl Scheme {
    pub const ALL: [Scheme; 5] = [
        Scheme::Int8,
        Scheme::Int4,
        Scheme::Nf4,
        Scheme::Fp8E4M3,
        Scheme::Fp8E5M2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::Int8 => "int8",
            Scheme::Int4 => "int4",
            Scheme::Nf4 => "nf4",
            Scheme::Fp8E4M3 => "fp8-e4m3",
            Scheme::Fp8E5M2 => "fp8-e5m2",
        }
    }

    /// Bits of one stored code.
    pub fn code_bits(self) -> u32 {
        match self {
            Scheme::Int8 | Scheme::Fp8E4M3 | Scheme::Fp8E5M2 => 8,
            Scheme::Int4 | Scheme::Nf4 => 4,
        }
    }

    fn supports_asymmetric(self) -> bool {
        matches!(self, Scheme::Int8 | Scheme::Int4)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Scheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = FormatError;

    fn from_str(s: &str) -> Result<Scheme, FormatError> {
        let unknown = || FormatError::UnknownScheme {
            name: s.to_string(),
        };
        match s.parse::<Format>().map_err(|_| unknown())? {
            Format::Int8 => Ok(Scheme::Int8),
            Format::Int4 => Ok(Scheme::Int4),
            Format::Nf4 => Ok(Scheme::Nf4),
            Format::Fp8E4M3 => Ok(Scheme::Fp8E4M3),
            Format::Fp8E5M2 => Ok(Scheme::Fp8E5M2),
            _ => Err(unknown()),
        }
    }
}

impl From<Scheme> for Format {
    /// The format of one code.
    fn from(scheme: Scheme) -> Format {
        match scheme {
            Scheme::Int8 => Format::Int8,
            Scheme::Int4 => Format::Int4,
            Scheme::Nf4 => Format::Nf4,
            Scheme::Fp8E4M3 => Format::Fp8E4M3,
            Scheme::Fp8E5M2 => Format::Fp8E5M2,
        }
    }
}

/// The code book one group uses, resolved from scheme and symmetry.
#[derive(Clone, Copy)]
enum Codes {
    /// Symmetric integers in [-limit, limit].
    SymmetricInt {
        limit: i32,
        range: IntRange,
    },
    /// Unsigned integers [0, max] with a zero point.
    AsymmetricInt {
        max: i32,
    },
    Nf4,
    Fp8(FloatLayout),
}

impl Codes {
    fn of(scheme: Scheme, symmetry: Symmetry) -> Codes {
        let sym = |range: IntRange| Codes::SymmetricInt {
            limit: range.max(),
            range,
        };
        match (scheme, symmetry) {
            (Scheme::Int8, Symmetry::Symmetric) => sym(IntRange::INT8),
            (Scheme::Int4, Symmetry::Symmetric) => sym(IntRange::INT4),
            (Scheme::Int8, Symmetry::Asymmetric) => Codes::AsymmetricInt {
                max: IntRange::UINT8.max(),
            },
            (Scheme::Int4, Symmetry::Asymmetric) => Codes::AsymmetricInt {
                max: IntRange::UINT4.max(),
            },
            (Scheme::Nf4, _) => Codes::Nf4,
            (Scheme::Fp8E4M3, _) => Codes::Fp8(FloatLayout::FP8_E4M3),
            (Scheme::Fp8E5M2, _) => Codes::Fp8(FloatLayout::FP8_E5M2),
        }
    }

    /// The exact (unrounded) scale for a group with these extremes.
    fn exact_scale(self, lo: f64, hi: f64) -> f64 {
        let absmax = lo.abs().max(hi.abs());
        match self {
            Codes::SymmetricInt { limit, .. } => absmax / limit as f64,
            Codes::AsymmetricInt { max } => (hi.max(0.0) - lo.min(0.0)) / max as f64,
            Codes::Nf4 => absmax,
            Codes::Fp8(layout) => absmax / layout.max(),
        }
    }

    /// Encodes `x / scale` (with zero point `zp`) to a code.
    fn encode(self, scaled: f64, zp: i32) -> u8 {
        let code = match self {
            Codes::SymmetricInt { limit, range } => {
                let q = scaled.round_ties_even().clamp(-limit as f64, limit as f64) as i32;
                range.to_bits(q)
            }
            Codes::AsymmetricInt { max } => {
                (scaled.round_ties_even() + zp as f64).clamp(0.0, max as f64) as u32
            }
            Codes::Nf4 => nf4_nearest(scaled),
            Codes::Fp8(layout) => layout.encode(scaled),
        };
        code as u8
    }

    /// The value of a code before scaling (zero point removed).
    fn decode(self, code: u8, zp: i32) -> f64 {
        match self {
            Codes::SymmetricInt { range, .. } => range.from_bits(code as u32) as f64,
            Codes::AsymmetricInt { .. } => (code as i32 - zp) as f64,
            Codes::Nf4 => NF4_LEVELS[(code & 0xF) as usize],
            Codes::Fp8(layout) => layout.decode(code as u32),
        }
    }
}

/// Quantizes a `rows × cols` row-major matrix. See the module docs for the policies.
pub fn quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
    config: &QuantConfig,
) -> Result<Quantized, QuantError> {
    let group_size = validate(data, rows, cols, config)?;
    let codes_of = Codes::of(config.scheme, config.symmetry);
    let scale_layout = config.scale_format.layout().expect("validated as float");
    let n_groups = data.len() / group_size;
    let mut out = Quantized {
        config: *config,
        rows,
        cols,
        group_size,
        codes: Vec::with_capacity(data.len()),
        scales: Vec::with_capacity(n_groups),
        zero_points: Vec::new(),
    };
    for (group_idx, group) in data.chunks_exact(group_size).enumerate() {
        let (lo, hi) = group.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| {
            (lo.min(x as f64), hi.max(x as f64))
        });
        let exact = codes_of.exact_scale(lo, hi);
        let scale = round_scale_up(exact, scale_layout).ok_or(QuantError::ScaleOutOfRange {
            group: group_idx,
            needed: exact,
            format: config.scale_format,
            max: scale_layout.max(),
        })?;
        let zp = match codes_of {
            // -lo/scale lies in [0, max] because the range includes 0 and the scale was rounded up.
            Codes::AsymmetricInt { max } if scale > 0.0 => (-lo.min(0.0) / scale)
                .round_ties_even()
                .clamp(0.0, max as f64)
                as i32,
            _ => 0,
        };
        for &x in group {
            let scaled = if scale > 0.0 { x as f64 / scale } else { 0.0 };
            out.codes.push(codes_of.encode(scaled, zp));
        }
        out.scales.push(scale);
        if config.symmetry == Symmetry::Asymmetric {
            out.zero_points.push(zp);
        }
    }
    Ok(out)
}

/// Checks shape, values and config; returns the resolved group size.
fn validate(
    data: &[f32],
    rows: usize,
    cols: usize,
    config: &QuantConfig,
) -> Result<usize, QuantError> {
    if rows.checked_mul(cols) != Some(data.len()) {
        return Err(QuantError::ShapeMismatch {
            len: data.len(),
            rows,
            cols,
        });
    }
    if data.is_empty() {
        return Err(QuantError::Empty { rows, cols });
    }
    if config.symmetry == Symmetry::Asymmetric && !config.scheme.supports_asymmetric() {
        return Err(QuantError::AsymmetricUnsupported {
            scheme: config.scheme,
        });
    }
    if config.scale_format.layout().is_none() {
        return Err(QuantError::ScaleFormatNotFloat {
            format: config.scale_format,
        });
    }
    let group_size = match config.granularity {
        Granularity::PerTensor => data.len(),
        Granularity::PerChannel => cols,
        Granularity::PerGroup(0) => return Err(QuantError::ZeroGroup),
        Granularity::PerGroup(g) if cols % g != 0 => {
            let suggestion = (1..=g.min(cols)).rev().find(|d| cols % d == 0).unwrap_or(1);
            return Err(QuantError::GroupDoesNotDivide {
                group_size: g,
                row_len: cols,
                suggestion,
            });
        }
        Granularity::PerGroup(g) => g,
    };
    if let Some(index) = data.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite {
            index,
            row: index / cols,
            col: index % cols,
            value: data[index],
        });
    }
    Ok(group_size)
}

/// The smallest value of `layout` at or above `exact` (≥ 0), or `None` if that is not finite.
fn round_scale_up(exact: f64, layout: FloatLayout) -> Option<f64> {
    let bits = layout.encode(exact);
    let nearest = layout.decode(bits);
    // Positive patterns grow with their value, so the next pattern is the next value up.
    let up = if nearest >= exact {
        nearest
    } else {
        layout.decode(bits + 1)
    };
    (up.is_finite() && up >= exact).then_some(up)
}

impl Quantized {
    /// x̂ = (code - zero_point) × scale, as f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let codes_of = Codes::of(self.config.scheme, self.config.symmetry);
        let mut out = Vec::with_capacity(self.codes.len());
        for (group_idx, group) in self.codes.chunks_exact(self.group_size).enumerate() {
            let scale = self.scales[group_idx];
            let zp = self.zero_points.get(group_idx).copied().unwrap_or(0);
            out.extend(
                group
                    .iter()
                    .map(|&code| (codes_of.decode(code, zp) * scale) as f32),
            );
        }
        out
    }

    /// What decides this matrix's stored size.
    pub fn storage_spec(&self) -> StorageSpec {
        StorageSpec {
            scheme: self.config.scheme,
            group_size: self.group_size as u64,
            scale_format: self.config.scale_format,
            symmetry: self.config.symmetry,
        }
    }

    /// Bytes of codes, scales and zero points.
    pub fn stored_bytes(&self) -> u64 {
        stored_bytes(self.codes.len() as u64, &self.storage_spec())
    }

    pub fn bits_per_weight(&self) -> f64 {
        bits_per_weight(&self.storage_spec())
    }
}
