//! Number formats for training and inference: fp32, fp16, bf16, fp8 (e4m3, e5m2), int8, uint8,
//! int4 and nf4 — their bit layouts, properties computed from the layout, an exact encoder and
//! decoder, explanations of one value's bits, and quantization with scales (`quant`).
//!
//! Pure: no IO, no printing, no environment. The float codec is written here (it is the product);
//! the `half` crate is only a test oracle.
//!
//! ```
//! use formats::Format;
//! assert_eq!(Format::F16.encode(3.14).unwrap(), 0x4248);
//! assert_eq!(Format::F16.decode(0x4248), 3.140625);
//! assert_eq!(Format::Fp8E4M3.properties().max, 448.0);
//! let bpw = formats::quant::bits_per_weight(&formats::quant::StorageSpec::int4_g128());
//! assert_eq!(bpw, 4.125);
//! ```

pub mod bnb;
mod error;
mod explain;
mod float;
mod int;
pub mod quant;
pub mod rng;

pub use error::{FormatError, QuantError};
pub use explain::{explain, BitFields, Explanation};
pub use float::{Class, Fields, FloatLayout, NanEncoding, Overflow};
pub use int::{nf4_nearest, IntRange, NF4_LEVELS};

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Every number format frugal knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    Bf16,
    /// OCP fp8 E4M3: no infinities, max 448, NaN = S.1111.111, saturating overflow.
    Fp8E4M3,
    /// OCP fp8 E5M2: IEEE-style, max 57344, ±inf and NaN, overflow to ±inf.
    Fp8E5M2,
    Int8,
    Uint8,
    Int4,
    /// QLoRA's 4-bit normal float: 16 fixed levels in [-1, 1], scaled per block by its absmax.
    Nf4,
}

/// How a format stores numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Float(FloatLayout),
    Int(IntRange),
    /// A 16-entry code book (NF4).
    Lookup(&'static [f64; 16]),
}

/// The properties of a format, computed from its layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Properties {
    pub format: Format,
    pub bits: u32,
    pub exponent_bits: Option<u32>,
    pub mantissa_bits: Option<u32>,
    pub bias: Option<i32>,
    /// Largest finite value (integer formats: largest code; NF4: largest level).
    pub max: f64,
    /// Most negative finite value.
    pub min: f64,
    pub smallest_normal: Option<f64>,
    pub smallest_subnormal: Option<f64>,
    /// Gap between 1 and the next representable value, 2^-M.
    pub epsilon: Option<f64>,
    /// log10(2^(M+1)).
    pub decimal_digits: Option<f64>,
    pub has_inf: bool,
    pub nan: Option<NanEncoding>,
    pub overflow: Overflow,
}

impl Format {
    pub const ALL: [Format; 9] = [
        Format::F32,
        Format::F16,
        Format::Bf16,
        Format::Fp8E4M3,
        Format::Fp8E5M2,
        Format::Int8,
        Format::Uint8,
        Format::Int4,
        Format::Nf4,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "fp32",
            Format::F16 => "fp16",
            Format::Bf16 => "bf16",
            Format::Fp8E4M3 => "fp8-e4m3",
            Format::Fp8E5M2 => "fp8-e5m2",
            Format::Int8 => "int8",
            Format::Uint8 => "uint8",
            Format::Int4 => "int4",
            Format::Nf4 => "nf4",
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Format::F32 => Kind::Float(FloatLayout::FP32),
            Format::F16 => Kind::Float(FloatLayout::FP16),
            Format::Bf16 => Kind::Float(FloatLayout::BF16),
            Format::Fp8E4M3 => Kind::Float(FloatLayout::FP8_E4M3),
            Format::Fp8E5M2 => Kind::Float(FloatLayout::FP8_E5M2),
            Format::Int8 => Kind::Int(IntRange::INT8),
            Format::Uint8 => Kind::Int(IntRange::UINT8),
            Format::Int4 => Kind::Int(IntRange::INT4),
            Format::Nf4 => Kind::Lookup(&NF4_LEVELS),
        }
    }

    /// The float layout, for float formats.
    pub fn layout(self) -> Option<FloatLayout> {
        match self.kind() {
            Kind::Float(layout) => Some(layout),
            _ => None,
        }
    }

    /// Storage width of one value in bits.
    pub fn bits(self) -> u32 {
        match self.kind() {
            Kind::Float(layout) => layout.bits(),
            Kind::Int(range) => range.bits,
            Kind::Lookup(levels) => levels.len().trailing_zeros(),
        }
    }

    pub fn properties(self) -> Properties {
        let none = Properties {
            format: self,
            bits: self.bits(),
            exponent_bits: None,
            mantissa_bits: None,
            bias: None,
            max: 0.0,
            min: 0.0,
            smallest_normal: None,
            smallest_subnormal: None,
            epsilon: None,
            decimal_digits: None,
            has_inf: false,
            nan: None,
            overflow: Overflow::Saturate,
        };
        match self.kind() {
            Kind::Float(l) => Properties {
                exponent_bits: Some(l.exponent_bits),
                mantissa_bits: Some(l.mantissa_bits),
                bias: Some(l.bias()),
                max: l.max(),
                min: -l.max(),
                smallest_normal: Some(l.smallest_normal()),
                smallest_subnormal: Some(l.smallest_subnormal()),
                epsilon: Some(l.epsilon()),
                decimal_digits: Some(l.decimal_digits()),
                has_inf: l.has_inf,
                nan: Some(l.nan),
                overflow: l.overflow,
                ..none
            },
            Kind::Int(r) => Properties {
                max: r.max() as f64,
                min: r.min() as f64,
                ..none
            },
            Kind::Lookup(levels) => Properties {
                max: levels[levels.len() - 1],
                min: levels[0],
                ..none
            },
        }
    }

    /// Encodes `x` into this format's bits: floats round to nearest even with the layout's
    /// overflow rule; integers round to nearest even and saturate; NF4 takes the nearest level.
    /// NaN has no integer or NF4 code: that is an error, never a silent zero.
    pub fn encode(self, x: f64) -> Result<u32, FormatError> {
        match self.kind() {
            Kind::Float(layout) => Ok(layout.encode(x)),
            _ if x.is_nan() => Err(FormatError::NanHasNoCode { format: self }),
            Kind::Int(range) => Ok(range.to_bits(range.encode(x))),
            Kind::Lookup(_) => Ok(nf4_nearest(x)),
        }
    }

    /// The value of a bit pattern (only the low `bits()` bits are read).
    pub fn decode(self, bits: u32) -> f64 {
        match self.kind() {
            Kind::Float(layout) => layout.decode(bits),
            Kind::Int(range) => range.from_bits(bits) as f64,
            Kind::Lookup(levels) => levels[(bits & 0xF) as usize],
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Format {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl FromStr for Format {
    type Err = FormatError;

    /// Accepts the names of [`Format::name`] and common aliases (`f16`, `half`, `bfloat16`,
    /// `e4m3`, `e5m2`, `float32`, ...), case-insensitively.
    fn from_str(s: &str) -> Result<Format, FormatError> {
        let lower = s.trim().to_ascii_lowercase().replace('_', "-");
        let format = match lower.as_str() {
            "fp32" | "f32" | "float32" | "float" => Format::F32,
            "fp16" | "f16" | "float16" | "half" => Format::F16,
            "bf16" | "bfloat16" => Format::Bf16,
            "fp8-e4m3" | "e4m3" | "fp8e4m3" | "float8-e4m3" => Format::Fp8E4M3,
            "fp8-e5m2" | "e5m2" | "fp8e5m2" | "float8-e5m2" => Format::Fp8E5M2,
            "int8" | "i8" => Format::Int8,
            "uint8" | "u8" => Format::Uint8,
            "int4" | "i4" => Format::Int4,
            "nf4" => Format::Nf4,
            _ => {
                return Err(FormatError::UnknownFormat {
                    name: s.to_string(),
                })
            }
        };
        Ok(format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>().unwrap(), f);
        }
        let err = "fp12".parse::<Format>().unwrap_err().to_string();
        assert!(err.contains("fp12") && err.contains("nf4"), "{err}");
    }

    #[test]
    fn nan_has_no_integer_code() {
        assert!(Format::Int8.encode(f64::NAN).is_err());
        assert!(Format::Fp8E4M3.encode(f64::NAN).is_ok());
    }
}
