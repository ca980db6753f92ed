//! The typed errors of this crate: what went wrong, with the facts needed to fix it.
//!
//! `FormatError` covers names and single values; `QuantError` covers quantizing a tensor. Both
//! messages end with what to do. Example: `"fp12".parse::<Format>()` fails with
//! `unknown format "fp12"; use one of fp32, fp16, ...`.

use crate::Format;

/// A format name or a single value that cannot be handled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "unknown format {name:?}; use one of fp32, fp16, bf16, fp8-e4m3, fp8-e5m2, int8, uint8, \
         int4, nf4"
    )]
    UnknownFormat { name: String },
    #[error(
        "unknown quantization scheme {name:?}; use one of int8, int4, nf4, fp8-e4m3, fp8-e5m2"
    )]
    UnknownScheme { name: String },
    #[error("NaN has no {format} code: integer and NF4 formats cannot hold NaN")]
    NanHasNoCode { format: Format },
}

/// Why a tensor cannot be quantized as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "element {index} (row {row}, column {col}) is {value}: quantization refuses NaN and \
         infinity, because no finite scale can represent them; clean or mask that value before \
         quantizing"
    )]
    NonFinite {
        index: usize,
        row: usize,
        col: usize,
        value: f32,
    },
    #[error(
        "group size {group_size} does not divide the row length {row_len}; use a group size that \
         divides {row_len} (the largest one not above {group_size} is {suggestion}), or one scale \
         per row"
    )]
    GroupDoesNotDivide {
        group_size: usize,
        row_len: usize,
        suggestion: usize,
    },
    #[error("group size 0 is not allowed; use a positive group size such as 64 or 128")]
    ZeroGroup,
    #[error("{len} values cannot form a {rows} × {cols} matrix; pass rows × cols = {len} values")]
    ShapeMismatch {
        len: usize,
        rows: usize,
        cols: usize,
    },
    #[error("nothing to quantize: the tensor is empty ({rows} × {cols})")]
    Empty { rows: usize, cols: usize },
    #[error(
        "{scheme} quantization is symmetric only (its levels are centred on zero and scaled by \
         the absolute maximum); ask for symmetric quantization"
    )]
    AsymmetricUnsupported { scheme: crate::quant::Scheme },
    #[error(
        "scales cannot be stored as {format}, which is not a float format; use fp16, bf16 or fp32"
    )]
    ScaleFormatNotFloat { format: Format },
    #[error(
        "group {group} needs a scale of {needed:e}, beyond the largest {format} value {max:e}; \
         store scales as fp32 or bf16"
    )]
    ScaleOutOfRange {
        group: usize,
        needed: f64,
        format: Format,
        max: f64,
    },
}
