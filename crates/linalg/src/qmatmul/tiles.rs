//! int4 weights in tiles of eight output rows (`QWeight::Int4Tiled`): the layout the integer kernel
//! reads as one stream and multiplies eight outputs a vector (two tiles, sixteen outputs, a 512-bit
//! vector at the AVX-512 levels), each output in a lane of its own, so a block's convert, scale and
//! multiply-add serve eight outputs (llama.cpp's AVX2 path repacks Q4_0 likewise, eight rows
//! interleaved, after loading).
//!
//! Tile t holds output rows 8t .. 8t + 8, each row's sub-blocks of 32 weights in order. A
//! sub-block of the tile is 128 bytes: four runs of 32, run k holding for output c = 0..8 bytes
//! 4k .. 4k + 4 of that output's 16-byte sub-block in int4's order (its weights 4k .. 4k + 4 in
//! the low nibbles, 16 + 4k .. 16 + 4k + 4 in the high ones). Scales and zero points run per
//! tile and group, the tile's eight outputs in order. OC must be a multiple of 8; the bytes and
//! their number are int4's, only their order differs.
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

/// Bytes of one tile's sub-block: eight outputs' 16 bytes.
const TILE_SUB: usize = TILE * SUB / 2;

/// The byte holding weight (o, i)'s code in the tiled codes of rows IC wide, and whether it is
/// the high nibble.
pub fn code_at(o: usize, i: usize, ic: usize) -> (usize, bool) {
    let (t, c) = (o / TILE, o % TILE);
    let (s, j) = (i / SUB, i % SUB);
    let b = j % (SUB / 2);
    let at = t * TILE * ic / 2 + s * TILE_SUB + b / 4 * 32 + c * 4 + b % 4;
    (at, j >= SUB / 2)
}

/// The index of output o's scale (or zero point) for group g, with `groups` groups a row.
pub fn group_at(o: usize, g: usize, groups: usize) -> usize {
    (o / TILE) * TILE * groups + g * TILE + o % TILE
}

/// Moves int4 codes of an (OC, IC) matrix from rows (`src`) into tiles (`dst`).
pub fn tile_codes(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    move_codes(src, dst, oc, ic, false);
}

/// The inverse of [`tile_codes`].
pub fn untile_codes(src: &[u8], dst: &mut [u8], oc: usize, ic: usize) {
    move_codes(src, dst, oc, ic, true);
}

/// Each 4-byte run from rows into tiles, or (`back`) from tiles into rows.
fn move_codes(src: &[u8], dst: &mut [u8], oc: usize, ic: usize, back: bool) {
    check(src.len(), dst.len(), oc, ic);
    for o in 0..oc {
        for s in 0..ic / SUB {
            for b in (0..SUB / 2).step_by(4) {
                let (tiled, _) = code_at(o, s * SUB + b, ic);
                let row = o * ic / 2 + s * SUB / 2 + b;
                let (from, to) = if back { (tiled, row) } else { (row, tiled) };
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

fn check(src: usize, dst: usize, oc: usize, ic: usize) {
    assert!(oc.is_multiple_of(TILE), "tiles of {TILE} rows; OC = {oc}");
    assert!(
        ic.is_multiple_of(SUB),
        "rows of whole sub-blocks of {SUB}; IC = {ic}"
    );
    assert!(src == oc * ic / 2 && dst == src, "two codes a byte");
}
