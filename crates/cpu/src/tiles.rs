//! The CPU backend's own layout for int4, int8 and nf4 weights: tiles of eight output rows
//! (`kernels::qmatmul::tiles`) where `qmatmul::tiles_int4` or `tiles_int8` holds (every level from
//! AVX2 up; nf4 as int4), which the integer kernel reads as one stream and multiplies eight outputs
//! a vector (sixteen, two tiles, at the AVX-512 levels). The same bytes as the packer's rows, in
//! another order (an int8 matrix's per-row scales keep theirs); a weights file still holds the rows
//! (`download_matrix` gives them back).
//!
//! Which matrices are tiled is decided by the path the backend was made at and each matrix's
//! shape, the same at upload and at every product. A tile's bytes lie where its eight rows'
//! did, so a range of whole tiles is a tiled matrix too: a Mixtral expert's rows of the stacked
//! matrices (2·F and C) run so, and a stack is tiled only where an expert's rows are whole tiles
//! (`QMatrix::row_block`).

use crate::infer_ops::{download_bytes, upload_bytes};
use crate::Cpu;
use engine::arena::Arena;
use engine::backend::QMatrix;
use kernels::qmatmul::{self, tiles};
use plan_frugal::WeightFormat;

impl Cpu {
    /// Whether `m` is kept in tiles of eight rows (each range of rows it runs in, whole tiles).
    pub(crate) fn tiled(&self, m: &QMatrix) -> bool {
        if m.row_block % tiles::TILE != 0 {
            return false;
        }
        match m.format {
            WeightFormat::Int4 { group, .. } | WeightFormat::Nf4 { group } => {
                qmatmul::tiles_int4(self.qmatmul_isa, m.rows, m.cols, group as usize)
            }
            WeightFormat::Int8 => qmatmul::tiles_int8(self.qmatmul_isa, m.rows, m.cols),
            _ => false,
        }
    }
}

pub(super) fn upload_matrix(a: &Arena<Cpu>, m: &QMatrix, parts: [&[u8]; 3]) {
    let [codes, scales, zeros] = parts;
    if !a.backend().tiled(m) {
        upload_bytes(a, m.codes, codes);
        if let Some(s) = m.scales {
            upload_bytes(a, s, scales);
        }
        if let Some(z) = m.zeros {
            upload_bytes(a, z, zeros);
        }
        return;
    }
    let (rows, cols, groups) = shape(m);
    let mut tiled = vec![0u8; codes.len()];
    if m.format == WeightFormat::Int8 {
        // One scale a row: the scales keep their order.
        tiles::tile_codes8(codes, &mut tiled, rows, cols);
        upload_bytes(a, m.codes, &tiled);
        return upload_bytes(a, m.scales.expect("int8 has scales"), scales);
    }
    tiles::tile_codes(codes, &mut tiled, rows, cols);
    upload_bytes(a, m.codes, &tiled);
    for (t, bytes, size) in [(m.scales, scales, scale_bytes(m)), (m.zeros, zeros, 1)] {
        if let Some(t) = t {
            let mut tiled = vec![0u8; bytes.len()];
            tiles::tile_groups(bytes, &mut tiled, rows, groups, size, false);
            upload_bytes(a, t, &tiled);
        }
    }
}

pub(super) fn download_matrix(a: &Arena<Cpu>, m: &QMatrix, parts: [&mut [u8]; 3]) {
    let [codes, scales, zeros] = parts;
    let tiled = a.backend().tiled(m);
    let (rows, cols, groups) = shape(m);
    let mut raw = vec![0u8; codes.len()];
    download_bytes(a, m.codes, &mut raw);
    let int8 = m.format == WeightFormat::Int8;
    match tiled {
        true if int8 => tiles::untile_codes8(&raw, codes, rows, cols),
        true => tiles::untile_codes(&raw, codes, rows, cols),
        false => codes.copy_from_slice(&raw),
    }
    for (t, bytes, size) in [(m.scales, scales, scale_bytes(m)), (m.zeros, zeros, 1)] {
        if let Some(t) = t {
            let mut raw = vec![0u8; bytes.len()];
            download_bytes(a, t, &mut raw);
            match tiled && !int8 {
                true => tiles::tile_groups(&raw, bytes, rows, groups, size, true),
                false => bytes.copy_from_slice(&raw),
            }
        }
    }
}

/// Rows, columns and groups a row of an int4 or nf4 matrix (one of an int8 one).
fn shape(m: &QMatrix) -> (usize, usize, usize) {
    let group = match m.format {
        WeightFormat::Int4 { group, .. } | WeightFormat::Nf4 { group } => group as usize,
        _ => m.cols,
    };
    (m.rows, m.cols, m.cols / group)
}

/// Bytes of one of `m`'s scales: nf4's fp32, int4's fp16.
fn scale_bytes(m: &QMatrix) -> usize {
    match m.format {
        WeightFormat::Nf4 { .. } => 4,
        _ => 2,
    }
}
