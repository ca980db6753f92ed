//! Which kernel multiplies a weight at a path: the AVX-512 VNNI int4 kernel, the AVX2 integer
//! kernel `q8avx2`, or a float path.

use super::{q8avx2, Isa, QWeight};

/// Whether the AVX-512 VNNI int4 kernel takes rows of `ic` in groups of `group`: whole
/// 128-weight chunks, each within one group or holding whole ones.
pub(super) fn vnni_chunks(group: usize, ic: usize) -> bool {
    let fits = group == 32 || group == 64 || group.is_multiple_of(128);
    ic.is_multiple_of(128) && fits
}

/// `w` as the AVX2 integer kernel multiplies it, with its activations' group, where it runs there
/// at `isa`: int4, int8 and nf4 in tiles at every level from AVX2 up, int4 in rows at the AVX2
/// levels and AVX-512 without VNNI (int4 dequantized to f32 multiply-adds ran at a quarter to a
/// third of this kernel's rate in tiles: `cargo bench -p kernels --bench qmatmul`, 2 Xeon model 207
/// cores), and at the VNNI level where [`vnni_chunks`] does not hold (SmolLM2's 576-wide rows);
/// int8 in rows, nf4 and ggml's blocks at every level from AVX2 up (the AVX-512 int8 path
/// multiplies in f32 and ran 0.56 of the bandwidth against this one's 0.82: TinyLlama int8 decode,
/// 2 Zen 4 cores; nf4's f32 table path ran TinyLlama at 0.16-0.20 of it capped to AVX2, this one
/// 0.60-0.62, on 2 Sapphire Rapids cores). `None`: a float path.
pub(super) fn integer_weights<'a>(
    isa: Isa,
    w: &QWeight<'a>,
    ic: usize,
) -> Option<(q8avx2::Weights<'a>, usize)> {
    let taken = match *w {
        QWeight::Int4 { group, .. } => match isa {
            Isa::Avx2 | Isa::Avx2Vnni | Isa::Avx512 => true,
            Isa::Avx512Vnni => !vnni_chunks(group, ic),
            _ => false,
        },
        QWeight::Int8 { .. }
        | QWeight::Int8Tiled { .. }
        | QWeight::Int4Tiled { .. }
        | QWeight::Grouped { .. }
        | QWeight::Grouped4 { .. } => isa != Isa::Portable,
        QWeight::Nf4 { .. } | QWeight::Nf4Tiled { .. } => isa != Isa::Portable,
        _ => false,
    };
    q8_weights(w, ic).filter(|_| taken)
}

/// The weights the AVX2 integer path multiplies, and the group its activations' sums follow:
/// int4, int8 whose rows are whole blocks of 32, ggml's blocks, and nf4 in groups of 32 or more
/// (its levels as signed bytes, `q8avx2::lut4`), in rows or tiles.
fn q8_weights<'a>(w: &QWeight<'a>, ic: usize) -> Option<(q8avx2::Weights<'a>, usize)> {
    match *w {
        QWeight::Int4 {
            codes,
            scales,
            zeros,
            group,
        } => Some((
            q8avx2::Weights::Int4 {
                codes,
                scales,
                zeros,
                group,
            },
            group,
        )),
        QWeight::Int4Tiled {
            codes,
            scales,
            zeros,
            group,
        } => Some((
            q8avx2::Weights::Int4Tiled {
                codes,
                scales,
                zeros,
                group,
            },
            group,
        )),
        QWeight::Int8 { codes, scales } if ic.is_multiple_of(32) => {
            Some((q8avx2::Weights::Int8 { codes, scales }, ic))
        }
        QWeight::Int8Tiled { codes, scales } => {
            Some((q8avx2::Weights::Int8Tiled { codes, scales }, ic))
        }
        QWeight::Grouped {
            codes,
            scales,
            mins,
            group,
        } => Some((
            q8avx2::Weights::Grouped {
                codes: q8avx2::Codes::I8(codes),
                scales,
                mins,
                group,
            },
            group,
        )),
        QWeight::Grouped4 {
            codes,
            scales,
            mins,
            group,
        } => Some((
            q8avx2::Weights::Grouped {
                codes: q8avx2::Codes::U4(codes),
                scales,
                mins,
                group,
            },
            group,
        )),
        QWeight::Nf4 {
            codes,
            scales,
            levels,
            group,
        } if ic.is_multiple_of(32) && group.is_multiple_of(32) => {
            let (table, unit) = q8avx2::lut4(levels);
            let codes = q8avx2::Codes::Lut4 { codes, table, unit };
            let w = q8avx2::Weights::Grouped {
                codes,
                scales,
                mins: None,
                group,
            };
            Some((w, group))
        }
        QWeight::Nf4Tiled {
            codes,
            scales,
            levels,
            group,
        } => {
            let (table, unit) = q8avx2::lut4(levels);
            let w = q8avx2::Weights::Nf4Tiled {
                codes,
                scales,
                table,
                unit,
                group,
            };
            Some((w, group))
        }
        _ => None,
    }
}
