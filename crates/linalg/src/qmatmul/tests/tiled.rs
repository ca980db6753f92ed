//! int4, int8 and nf4 in tiles of eight output rows: the same weights as the rows they came from,
//! the reference's products on every path, and the same bits whatever the rows, threads or dot.

use super::*;

/// The tiled copy of `w`'s codes, scales and zero points.
fn tiled(s: &Stored, oc: usize, ic: usize, groups: usize) -> (Vec<u8>, Vec<f16>, Vec<u8>) {
    let mut codes = vec![0u8; s.u8s.len()];
    tiles::tile_codes(&s.u8s, &mut codes, oc, ic);
    let row_groups = groups / oc;
    let raw: Vec<u8> = s.h_scales[..groups]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let mut scales = vec![0u8; raw.len()];
    tiles::tile_groups(&raw, &mut scales, oc, row_groups, 2, false);
    let scales = scales
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]))
        .collect();
    let mut zeros = vec![0u8; groups];
    tiles::tile_groups(&s.zeros, &mut zeros, oc, row_groups, 1, false);
    (codes, scales, zeros)
}

#[test]
fn tiled_int4_holds_every_weight_of_its_rows_and_tiles_back() {
    let (oc, ic, group) = (24, 320, 64);
    let groups = oc * ic / group;
    let s = stored(&mut Rng::new(3), oc, ic, groups);
    let (codes, scales, zeros) = tiled(&s, oc, ic, groups);
    for asym in [false, true] {
        let rows = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: asym.then_some(&s.zeros[..]),
            group,
        };
        let tiles = QWeight::Int4Tiled {
            codes: &codes,
            scales: &scales,
            zeros: asym.then_some(&zeros[..]),
            group,
        };
        tiles.check(oc, ic);
        for o in 0..oc {
            for i in 0..ic {
                assert_eq!(rows.at(o, i, ic), tiles.at(o, i, ic), "({o}, {i})");
            }
        }
    }
    let mut back = vec![0u8; codes.len()];
    tiles::untile_codes(&codes, &mut back, oc, ic);
    assert_eq!(back, s.u8s);
    let mut z = vec![0u8; groups];
    tiles::tile_groups(&zeros, &mut z, oc, groups / oc, 1, true);
    assert_eq!(z, s.zeros);
}

#[test]
fn tiled_int4_matches_the_reference_and_keeps_its_bits_on_every_path() {
    // Groups of 32 and 128, rows that are not whole 128-weight chunks (320), groups of 96 (9
    // blocks a row: an odd number), SmolLM2's 576-wide rows; 296 outputs: 37 tiles.
    for (ic, group, asym) in [
        (512, 32, false),
        (512, 128, true),
        (320, 32, true),
        (288, 96, false),
        (576, 64, false),
    ] {
        let oc = 296;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64 + group as u64), oc, ic, groups);
        let (codes, scales, zeros) = tiled(&s, oc, ic, groups);
        let w = QWeight::Int4Tiled {
            codes: &codes,
            scales: &scales,
            zeros: asym.then_some(&zeros[..]),
            group,
        };
        let name = format!("int4 tiled ic={ic} g{group}");
        check_all(&name, &w, ic, oc);
        same_bits_whatever_rows_or_threads(&w, ic, oc);
        // Every integer path's sums are the same integers, added in the same order.
        same_bits_on_every_integer_path(&name, &w, ic, oc);
    }
}

/// int8 codes of an (OC, IC) matrix in tiles of eight rows.
fn tiled8(rows: &[i8], oc: usize, ic: usize) -> Vec<i8> {
    let raw: Vec<u8> = rows.iter().map(|&c| c as u8).collect();
    let mut codes = vec![0u8; raw.len()];
    tiles::tile_codes8(&raw, &mut codes, oc, ic);
    codes.iter().map(|&c| c as i8).collect()
}

/// `w`'s output bits on every integer path, which must agree.
fn same_bits_on_every_integer_path(name: &str, w: &QWeight, ic: usize, oc: usize) {
    let n = 5;
    let inp: Vec<f32> = (0..n * ic).map(|i| (i % 19) as f32 * 0.1 - 0.9).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut first: Option<Vec<u32>> = None;
    for isa in isas().into_iter().filter(|&i| i != Isa::Portable) {
        let mut out = vec![0.0f32; n * oc];
        matmul_on(isa, &mut out, &inp, w, n, ic, oc);
        match &first {
            None => first = Some(bits(&out)),
            Some(b) => assert!(&bits(&out) == b, "{name} {}", isa.name()),
        }
    }
}

#[test]
fn tiled_int8_holds_every_weight_of_its_rows_and_tiles_back() {
    let (oc, ic) = (24, 320);
    let s = stored(&mut Rng::new(4), oc, ic, oc);
    let codes = tiled8(&s.i8s, oc, ic);
    let scales = &s.h_scales[..oc];
    let rows = QWeight::Int8 {
        codes: &s.i8s,
        scales,
    };
    let tiled = QWeight::Int8Tiled {
        codes: &codes,
        scales,
    };
    tiled.check(oc, ic);
    for o in 0..oc {
        for i in 0..ic {
            assert_eq!(rows.at(o, i, ic), tiled.at(o, i, ic), "({o}, {i})");
        }
    }
    let flat: Vec<u8> = codes.iter().map(|&c| c as u8).collect();
    let mut back = vec![0u8; flat.len()];
    tiles::untile_codes8(&flat, &mut back, oc, ic);
    let raw: Vec<u8> = s.i8s.iter().map(|&c| c as u8).collect();
    assert!(back == raw, "int8 tiles back to rows");
}

#[test]
fn tiled_int8_matches_the_reference_and_keeps_its_bits_on_every_path() {
    // 296 outputs: 37 tiles (an odd last one beside the 512-bit pairs); rows of 320 and 576
    // (SmolLM2's), and codes at ±127 and -128, where the pair sums come nearest 16 bits.
    for (ic, extreme) in [(512, false), (320, false), (576, false), (256, true)] {
        let oc = 296;
        let s = stored(&mut Rng::new(ic as u64 + 9), oc, ic, oc);
        let rows: Vec<i8> = match extreme {
            true => (0..oc * ic).map(|i| [127, -127, -128][i % 3]).collect(),
            false => s.i8s.clone(),
        };
        let codes = tiled8(&rows, oc, ic);
        let w = QWeight::Int8Tiled {
            codes: &codes,
            scales: &s.h_scales[..oc],
        };
        let name = format!("int8 tiled ic={ic}");
        check_all(&name, &w, ic, oc);
        same_bits_whatever_rows_or_threads(&w, ic, oc);
        same_bits_on_every_integer_path(&name, &w, ic, oc);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn activations_too_small_for_a_scale_count_as_zeros() {
    // A block whose absmax is below 3.7e-37 has no finite 1 / scale: it counts as zeros, beside
    // a block of normal values that multiplies as ever. Only the integer paths quantize
    // activations: a CPU without AVX2 runs none of them.
    if !Isa::Avx2.runs_here() {
        return;
    }
    let (oc, ic) = (16, 64);
    let s = stored(&mut Rng::new(11), oc, ic, oc);
    let codes = tiled8(&s.i8s, oc, ic);
    let w = QWeight::Int8Tiled {
        codes: &codes,
        scales: &s.h_scales[..oc],
    };
    let tiny = |i: usize| if i.is_multiple_of(2) { 1e-38 } else { -1e-38 };
    // Row 0: both blocks tiny; row 1: a normal block, then a tiny one.
    let inp: Vec<f32> = (0..2 * ic)
        .map(|i| match i < ic + 32 && i >= ic {
            true => (i % 7) as f32 - 3.0,
            false => tiny(i),
        })
        .collect();
    let mut normal = inp[ic..].to_vec();
    normal[32..].fill(0.0);
    let mut want = vec![0.0f32; oc];
    reference(&mut want, &avx2_activations(&normal, 1, ic), &w, 1, ic, oc);
    for isa in isas().into_iter().filter(|&i| i != Isa::Portable) {
        let mut got = vec![f32::NAN; 2 * oc];
        matmul_on(isa, &mut got, &inp, &w, 2, ic, oc);
        assert!(
            got[..oc].iter().all(|&x| x == 0.0),
            "{}: {got:?}",
            isa.name()
        );
        for (g, x) in got[oc..].iter().zip(&want) {
            assert!(
                (g - x).abs() <= 1e-5 * x.abs().max(1.0),
                "{}: {g} against {x}",
                isa.name()
            );
        }
    }
}

/// nf4's fp32 scales, `groups` a row, in tiles (as the CPU backend moves them: 4 bytes each).
fn tiled_f32(scales: &[f32], oc: usize, groups: usize) -> Vec<f32> {
    let raw: Vec<u8> = scales.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut tiled = vec![0u8; raw.len()];
    tiles::tile_groups(&raw, &mut tiled, oc, groups, 4, false);
    let back = tiled
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut rows = vec![0u8; raw.len()];
    tiles::tile_groups(&tiled, &mut rows, oc, groups, 4, true);
    assert!(rows == raw, "scales tile back to rows");
    back
}

#[test]
fn tiled_nf4_matches_its_rows_and_the_reference_and_keeps_its_bits_on_every_path() {
    // Groups of 64 (bitsandbytes' block), 32 and 128; rows of 320 and SmolLM2's 576; 296
    // outputs: 37 tiles, an odd last one beside the 512-bit pairs. Codes 0 and 15 hold the
    // levels ±1, whose bytes are ±127.
    for (ic, group, extreme) in [
        (512, 64, false),
        (320, 32, false),
        (576, 64, false),
        (256, 128, true),
    ] {
        let oc = 296;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64 + 17), oc, ic, groups);
        let rows: Vec<u8> = match extreme {
            true => (0..oc * ic / 2)
                .map(|i| [0x0F, 0xF0, 0xFF, 0x00][i % 4])
                .collect(),
            false => s.u8s.clone(),
        };
        let mut codes = vec![0u8; rows.len()];
        tiles::tile_codes(&rows, &mut codes, oc, ic);
        let scales = tiled_f32(&s.f_scales[..groups], oc, ic / group);
        let plain = QWeight::Nf4 {
            codes: &rows,
            scales: &s.f_scales[..groups],
            levels: &NF4,
            group,
        };
        let w = QWeight::Nf4Tiled {
            codes: &codes,
            scales: &scales,
            levels: &NF4,
            group,
        };
        w.check(oc, ic);
        for (o, i) in (0..oc).flat_map(|o| (0..ic).map(move |i| (o, i))) {
            assert_eq!(plain.at(o, i, ic), w.at(o, i, ic), "({o}, {i})");
        }
        let name = format!("nf4 tiled ic={ic} g{group}");
        check_all(&name, &w, ic, oc);
        same_bits_whatever_rows_or_threads(&w, ic, oc);
        same_bits_on_every_integer_path(&name, &w, ic, oc);
    }
}
