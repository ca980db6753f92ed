//! int4, int8 and nf4 weights in tiles of eight output rows (`QWeight::Int4Tiled`, `Int8Tiled`,
//! `Nf4Tiled`, which holds int4's order): the layout the integer kernel reads as one stream and
//! multiplies eight outputs a vector (two tiles, sixteen outputs, a 512-bit vector at the AVX-512
//! levels), each output in a lane of its own, so a block's convert, scale and multiply-add serve
//! eight outputs (llama.cpp's AVX2 path repacks Q4_0 likewise, eight rows interleaved, after
//! loading).
//!
//! Tile t holds output rows 8t .. 8t + 8, each row's sub-blocks of 32 weights in order. A sub-block
//! of the tile is 128 bytes: four runs of 32, run k holding for output c = 0..8 bytes 4k .. 4k + 4
//! of that output's 16-byte sub-block in int4's order (its weights 4k .. 4k + 4 in the low nibbles,
//! 16 + 4k .. 16 + 4k + 4 in the high ones). Scales and zero points run per tile and group, the
//! tile's eight outputs in order. OC must be a multiple of 8; the bytes and their number are
//! int4's, only their order differs. int8 tiles alike: a sub-block of the tile is 256 bytes, eight
//! runs of 32, run k holding output c's weights 4k .. 4k + 4 ([`tile_codes8`]).
//!
//! ```
//! use linalg::qmatmul::tiles;
//! // One tile: 8 rows of 32 weights, 16 bytes a row.
//! let codes: Vec<u8> = (0..128).map(|i| i as u8).collect();
//! let mut tiled = vec![0u8; 128];
//! tiles::tile_codes(&codes, &mut tiled, 8, 32);
//! assert_eq!(&tiled[..8], &[0, 1, 2, 3, 16, 17, 18, 19]); // row 0's run 0, then row 1's
//! let mut back = vec![0u8; 128];
//! tiles::untile_codes(&tiled, &mut back, 8, 32);
//! assert_eq!(back, codes);
//! ```

use super::SUB;

/// Output rows a tile holds.
pub const TILE: usize = 8;

/// The tiled place of byte `b` of output o's sub-block s, where a row's sub-block is `sb` bytes
/// (int4 16, int8 32) and a row `row` bytes: runs of 4 bytes, the tile's eight outputs side by
/// side in each run of 32.
fn byte_at(o: usize, s: usize, b: usize, row: usize, sb: usize) -> usize {
    let (t, c) = (o / TILE, o % TILE);
    t * TILE * row + s * TILE * sb + b / 4 * 32 + c * 4 + b % 4
}

/// The byte holding weight (o, i)'s code in the tiled codes of rows IC wide, and whether it is
/// the high nibble.
pub fn code_at(o: usize, i: usize, ic: usize) -> (usize, bool) {
    let j = i % SUB;
    let at = byte_at(o, i / SUB, j % (SUB / 2), ic / 2, SUB / 2);
    (at, j >= SUB / 2)
}

/// The byte holding int8 weight (o, i) in the tiled codes of rows IC wide ([`tile_codes8`]).
pub fn code_at8(o: usize, i: usize, ic: usize) -> usize {
    byte_at(o, i / SUB, i % SUB, ic, SUB)
}

/// The index of output o's scale (or zero point) for group g, with `groups` groups a row.
pub fn group_at(o: usize, g: usize, groups: usize) -> usize {
    (o / TILE) * TILE * groups + g * TILE + o % TILE
}

/// Moves int4 codes of an (OC, IC) matrix from rows (`src`) into tiles (`dst`).
pub fn tile_codes(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    check(src.len(), dst.len(), oc, ic, 2);
    move_codes(src, dst, oc, ic / 2, SUB / 2, false);
}

/// The inverse of [`tile_codes`].
pub fn untile_codes(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    check(src.len(), dst.len(), oc, ic, 2);
    move_codes(src, dst, oc, ic / 2, SUB / 2, true);
}

/// Moves int8 codes (one byte each) of an (OC, IC) matrix from rows into tiles of eight rows:
/// a tile's sub-block is 256 bytes, eight runs of 32, run k holding for output c = 0..8 its
/// weights 4k .. 4k + 4 of the sub-block. The per-row scales keep their order.
pub fn tile_codes8(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    check(src.len(), dst.len(), oc, ic, 1);
    move_codes(src, dst, oc, ic, SUB, false);
}

/// The inverse of [`tile_codes8`].
pub fn untile_codes8(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    check(src.len(), dst.len(), oc, ic, 1);
    move_codes(src, dst, oc, ic, SUB, true);
}

/// Each 4-byte run of rows `row` bytes long (sub-blocks of `sb`) from rows into tiles, or
/// (`back`) from tiles into rows.
fn move_codes(src: &[u8], dst: &mut [u8], oc: usize, row: usize, sb: usize, back: bool) {
    for o in 0..oc {
        for s in 0..row / sb {
            for b in (0..sb).step_by(4) {
                let tiled = byte_at(o, s, b, row, sb);
                let flat = o * row + s * sb + b;
                let (from, to) = if back { (tiled, flat) } else { (flat, tiled) };
                dst[to..to + 4].copy_from_slice(&src[from..from + 4]);
            }
        }
    }
}

/// Moves per-group values of `size` bytes each (scales, zero points), `groups` a row, from rows
/// into tiles; with `back`, from tiles into rows.
pub fn tile_groups(src: &[u8], dst: &mut [u8], oc: usize, groups: usize, size: usize, back: bool) {
    assert!(oc.is_multiple_of(TILE), "tiles of {TILE} rows; OC = {oc}");
    assert!(
        src.len() == oc * groups * size && dst.len() == src.len(),
        "per-group sizes"
    );
    for o in 0..oc {
        for g in 0..groups {
            let (row, tiled) = ((o * groups + g) * size, group_at(o, g, groups) * size);
            let (from, to) = if back { (tiled, row) } else { (row, tiled) };
            dst[to..to + size].copy_from_slice(&src[from..from + size]);
        }
    }
}

/// Whole tiles of whole sub-blocks, `per_byte` codes a byte.
fn check(src: usize, dst: usize, oc: usize, ic: usize, per_byte: usize) {
    assert!(oc.is_multiple_of(TILE), "tiles of {TILE} rows; OC = {oc}");
    assert!(
        ic.is_multiple_of(SUB),
        "rows of whole sub-blocks of {SUB}; IC = {ic}"
    );
    assert!(
        src == oc * ic / per_byte && dst == src,
        "{per_byte} codes a byte"
    );
}
