//! The storage formats of the serving plan: how weight matrices ([`WeightFormat`]) and the KV
//! cache ([`KvFormat`]) are stored, their byte counts, and their flag spellings.
//!
//! Example: `WeightFormat::parse("int4", Some(32))?.matrix_bytes(Role::QkvWeight, 4096, 4096)` is
//! (8 MiB of codes, 1 MiB of fp16 scales, no zero points).

use super::super::units::Role;
pub use plan::roles::Roles;
use plan::PlanError;

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

/// How weight matrices are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    Bf16,
    /// Symmetric, one fp16 scale per output row.
    Int8,
    /// Groups of `group` weights with an fp16 scale; `asym`: a zero point per group too.
    Int4 {
        group: u64,
        asym: bool,
    },
    /// QLoRA's NormalFloat4, an fp32 absmax per group.
    Nf4 {
        group: u64,
    },
    /// ggml's block types held exactly: an int8 code per weight, an fp32 scale and an fp32
    /// minimum per group of `group` (32, or 16 when the file has Q6_K: 1.25 or 1.5 bytes a
    /// weight); a type without minima has zeros. The matrices in `nibbles` (those a file holds
    /// in 4-bit types, Q4_0, Q4_1 and Q4_K, in every layer) keep their codes two a byte: 0.75
    /// bytes a weight in groups of 32. Float weights are quantized into it Q8_0-like
    /// (absmax / 127).
    Ggml {
        group: u64,
        nibbles: Roles,
    },
}

impl WeightFormat {
    /// The format one matrix of `role` is stored in: `ggml` with its codes two a byte (all
    /// roles in `nibbles`) or one a byte (none); every other format as it is.
    pub fn of(self, role: Role) -> WeightFormat {
        match self {
            WeightFormat::Ggml { group, nibbles } => WeightFormat::Ggml {
                group,
                nibbles: match nibbles.has(role) {
                    true => Roles::ALL,
                    false => Roles::NONE,
                },
            },
            f => f,
        }
    }

    /// Whether a `ggml` matrix of `role` keeps its 4-bit codes two a byte.
    pub fn nibbles(self, role: Role) -> bool {
        matches!(self, WeightFormat::Ggml { nibbles, .. } if nibbles.has(role))
    }

    /// Bytes of a (rows, cols) matrix of `role`: codes, scales and zero points.
    pub fn matrix_bytes(self, role: Role, rows: u64, cols: u64) -> (u64, u64, u64) {
        let n = rows * cols;
        match self {
            WeightFormat::F32 => (4 * n, 0, 0),
            WeightFormat::Bf16 => (2 * n, 0, 0),
            WeightFormat::Int8 => (n, 2 * rows, 0),
            WeightFormat::Int4 { group, asym } => {
                (n / 2, 2 * (n / group), if asym { n / group } else { 0 })
            }
            WeightFormat::Nf4 { group } => (n / 2, 4 * (n / group), 0),
            WeightFormat::Ggml { group, nibbles } => {
                let codes = if nibbles.has(role) { n / 2 } else { n };
                (codes, 4 * (n / group), 4 * (n / group))
            }
        }
    }

    /// The group size, for formats that have one.
    pub fn group(self) -> Option<u64> {
        match self {
            WeightFormat::Int4 { group, .. }
            | WeightFormat::Nf4 { group }
            | WeightFormat::Ggml { group, .. } => Some(group),
            _ => None,
        }
    }

    /// The flag spelling: `f32`, `bf16`, `int8`, `int4`, `int4-asym`, `nf4`, `ggml`.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Int8 => "int8",
            WeightFormat::Int4 { asym: false, .. } => "int4",
            WeightFormat::Int4 { asym: true, .. } => "int4-asym",
            WeightFormat::Nf4 { .. } => "nf4",
            WeightFormat::Ggml { .. } => "ggml",
        }
    }

    /// Parses a `--weights` value with the group size of `--weight-group` (default 32).
    pub fn parse(name: &str, group: Option<u64>) -> Result<WeightFormat, PlanError> {
        let group = group.unwrap_or(32);
        let f = match name {
            "f32" | "fp32" => WeightFormat::F32,
            "bf16" => WeightFormat::Bf16,
            "int8" => WeightFormat::Int8,
            "int4" => WeightFormat::Int4 { group, asym: false },
            "int4-asym" => WeightFormat::Int4 { group, asym: true },
            "nf4" => WeightFormat::Nf4 { group },
            // A GGUF file's loader takes the file's own group and 4-bit matrices instead.
            "ggml" => WeightFormat::Ggml {
                group,
                nibbles: Roles::NONE,
            },
            other => {
                return Err(invalid(
                    "--weights",
                    format!(
                        "'{other}' is not a weight format this engine runs: use f32, bf16, \
                         int8, int4, int4-asym, nf4 or ggml"
                    ),
                ))
            }
        };
        if let WeightFormat::Ggml { group, .. } = f {
            if group != 16 && group != 32 {
                return Err(invalid(
                    "--weight-group",
                    format!("ggml weights in groups of {group}: use 32 (or 16, Q6_K's)"),
                ));
            }
        } else if let Some(g) = f.group() {
            if ![32, 64, 128].contains(&g) {
                return Err(invalid(
                    "--weight-group",
                    format!("groups of {g}: use 32, 64 or 128"),
                ));
            }
        }
        Ok(f)
    }
}

/// How the KV cache stores keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvFormat {
    F32,
    Bf16,
    /// Symmetric int8, an fp32 scale per token and head.
    Int8,
    /// fp8 e4m3, an fp32 scale per token and head.
    Fp8,
}

impl KvFormat {
    pub fn element_bytes(self) -> u64 {
        match self {
            KvFormat::F32 => 4,
            KvFormat::Bf16 => 2,
            KvFormat::Int8 | KvFormat::Fp8 => 1,
        }
    }

    pub fn has_scales(self) -> bool {
        matches!(self, KvFormat::Int8 | KvFormat::Fp8)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::Bf16 => "bf16",
            KvFormat::Int8 => "int8",
            KvFormat::Fp8 => "fp8",
        }
    }

    pub fn parse(name: &str) -> Result<KvFormat, PlanError> {
        Ok(match name {
            "f32" | "fp32" => KvFormat::F32,
            "bf16" => KvFormat::Bf16,
            "int8" => KvFormat::Int8,
            "fp8" | "fp8-e4m3" => KvFormat::Fp8,
            other => {
                return Err(invalid(
                    "--kv-dtype",
                    format!(
                        "'{other}' is not a KV format this engine runs: use f32, bf16, int8 or fp8"
                    ),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Role, Roles, WeightFormat};

    #[test]
    fn ggml_takes_groups_of_32_or_16_and_counts_a_scale_and_minimum_each() {
        let g32 = WeightFormat::parse("ggml", Some(32)).unwrap();
        assert_eq!(g32.group(), Some(32));
        // 4096 × 4096: a byte of code a weight, 4 + 4 bytes a group.
        let qkv = Role::QkvWeight;
        assert_eq!(
            g32.matrix_bytes(qkv, 4096, 4096),
            (1 << 24, 1 << 21, 1 << 21)
        );
        let g16 = WeightFormat::parse("ggml", Some(16)).unwrap();
        assert_eq!(g16.matrix_bytes(qkv, 16, 32), (512, 128, 128));
        let err = WeightFormat::parse("ggml", Some(64))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--weight-group") && err.contains("16"),
            "{err}"
        );
    }

    #[test]
    fn ggml_keeps_the_codes_of_its_4_bit_roles_two_a_byte() {
        let nibbles = Roles::NONE.with(Role::QkvWeight).with(Role::FcWeight);
        let f = WeightFormat::Ggml { group: 32, nibbles };
        // Half a byte of code a weight where packed, a byte elsewhere; the same scales and minima.
        assert_eq!(f.matrix_bytes(Role::QkvWeight, 64, 64), (2048, 512, 512));
        assert_eq!(f.matrix_bytes(Role::FcProjWeight, 64, 64), (4096, 512, 512));
        assert!(f.nibbles(Role::FcWeight) && !f.nibbles(Role::TokenEmbedding));
        // A matrix's own format says the same for any role.
        assert!(f.of(Role::QkvWeight).nibbles(Role::LmHead));
        assert!(!f.of(Role::LmHead).nibbles(Role::QkvWeight));
        assert!(!nibbles.has(Role::Norm1Weight) && !Roles::ALL.has(Role::Norm1Weight));
        assert_eq!(
            Roles::ALL.difference(nibbles),
            Roles::ALL.difference(Roles::NONE.with(Role::FcWeight).with(Role::QkvWeight))
        );
        assert!(Roles::NONE.is_empty() && !nibbles.is_empty());
        assert!(!WeightFormat::Int8.nibbles(Role::QkvWeight));
    }
}
