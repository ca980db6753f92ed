//! Every path against the f64 reference, for every stored layout, odd row counts (passes of
//! [`ROWS`] and a remainder) and a column count with a tail (f32, bf16, int8).

use super::*;
use crate::testutil::Rng;
#[cfg(target_arch = "x86_64")]
use route::integer_weights;

mod tiled;

const NF4: [f32; 16] = [
    -1.0, -0.696, -0.525, -0.395, -0.284, -0.185, -0.091, 0.0, 0.08, 0.161, 0.246, 0.338, 0.441,
    0.563, 0.723, 1.0,
];

struct Stored {
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    i8s: Vec<i8>,
    u8s: Vec<u8>,
    zeros: Vec<u8>,
    h_scales: Vec<f16>,
    f_scales: Vec<f32>,
}

fn stored(rng: &mut Rng, oc: usize, ic: usize, groups: usize) -> Stored {
    let n = oc * ic;
    Stored {
        f32s: (0..n).map(|_| rng.uniform() as f32).collect(),
        bf16s: (0..n).map(|_| bf16::from_f64(rng.uniform())).collect(),
        i8s: (0..n)
            .map(|_| (rng.below(255) as i32 - 127) as i8)
            .collect(),
        u8s: (0..n / 2).map(|_| rng.below(256) as u8).collect(),
        zeros: (0..groups).map(|_| rng.below(16) as u8).collect(),
        h_scales: (0..groups.max(oc))
            .map(|_| f16::from_f64(rng.uniform() * 0.1))
            .collect(),
        f_scales: (0..groups).map(|_| rng.uniform() as f32).collect(),
    }
}

fn isas() -> Vec<Isa> {
    supported()
}

fn check_all(name: &str, w: &QWeight, ic: usize, oc: usize) {
    let mut rng = Rng::new(7);
    // 4 rows: the integer kernel's two outputs at a time.
    for n in [1, 3, 4, 8, 11] {
        let inp: Vec<f32> = (0..n * ic).map(|_| rng.uniform() as f32).collect();
        let mut want = vec![0.0f32; n * oc];
        reference(&mut want, &inp, w, n, ic, oc);
        for isa in isas() {
            let mut want = want.clone();
            #[cfg(target_arch = "x86_64")]
            let integer = integer_weights(isa, w, ic).is_some();
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx512Vnni && matches!(w, QWeight::Int4 { .. }) && !integer {
                // The VNNI path multiplies int8 activations: compare with exactly those.
                reference(&mut want, &vnni_activations(&inp, n, ic), w, n, ic, oc);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let integer = false;
            if (integer || isa == Isa::Portable) && ggml::takes(w) {
                // ggml's arithmetic itself against the exact product (`want` here): the error of
                // its 8-bit activations only (a code in the wrong place would cost the sum).
                let exact = want.clone();
                ggml::reference(&mut want, &inp, w, n, ic, oc);
                let (err, norm) = want.iter().zip(&exact).fold((0.0, 0.0), |(e, s), (g, x)| {
                    (e + f64::from(g - x).powi(2), s + f64::from(*x).powi(2))
                });
                assert!(
                    err.sqrt() <= 0.02 * norm.sqrt(),
                    "{name} n={n}: ggml's {err} {norm}"
                );
                // ggml's blocks of 32: ggml's own arithmetic, bit for bit.
                let mut got = vec![f32::NAN; n * oc];
                matmul_on(isa, &mut got, &inp, w, n, ic, oc);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{name} {} n={n}", isa.name());
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            {
                if integer {
                    // So does the AVX2 integer path (int4, grouped, and int8 in whole blocks of
                    // 32), and nf4's levels as its table of signed bytes holds them.
                    let table_levels = nf4_as_multiplied(w);
                    let w = match (*w, &table_levels) {
                        (
                            QWeight::Nf4 {
                                codes,
                                scales,
                                group,
                                ..
                            },
                            Some(levels),
                        ) => QWeight::Nf4 {
                            codes,
                            scales,
                            levels,
                            group,
                        },
                        (
                            QWeight::Nf4Tiled {
                                codes,
                                scales,
                                group,
                                ..
                            },
                            Some(levels),
                        ) => QWeight::Nf4Tiled {
                            codes,
                            scales,
                            levels,
                            group,
                        },
                        _ => *w,
                    };
                    reference(&mut want, &avx2_activations(&inp, n, ic), &w, n, ic, oc);
                }
            }
            let mut got = vec![f32::NAN; n * oc];
            matmul_on(isa, &mut got, &inp, w, n, ic, oc);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let scale = e.abs().max(1.0);
                assert!(
                    (g - e).abs() <= 2e-5 * scale * (ic as f32).sqrt(),
                    "{name} {} n={n} [{i}]: {g} vs {e}",
                    isa.name()
                );
            }
        }
    }
}

/// An nf4 weight's levels as the integer path multiplies them: its table's bytes times the
/// table's unit.
#[cfg(target_arch = "x86_64")]
fn nf4_as_multiplied(w: &QWeight) -> Option<[f32; 16]> {
    let (QWeight::Nf4 { levels, .. } | QWeight::Nf4Tiled { levels, .. }) = w else {
        return None;
    };
    let (table, unit) = q8avx2::lut4(levels);
    Some(std::array::from_fn(|i| f32::from(table[i]) * unit))
}

#[cfg(target_arch = "x86_64")]
#[test]
fn nf4_levels_become_signed_bytes_within_half_a_step() {
    let (table, unit) = q8avx2::lut4(&NF4);
    assert_eq!((table[0], table[7], table[15]), (-127, 0, 127));
    assert_eq!(unit, 1.0 / 127.0);
    for (l, t) in NF4.iter().zip(table) {
        assert!((l - f32::from(t) * unit).abs() <= 0.5 * unit, "{l} as {t}");
    }
    // A table of one sign and a zero table.
    let half: [f32; 16] = std::array::from_fn(|i| i as f32 / 30.0);
    let (table, unit) = q8avx2::lut4(&half);
    assert_eq!((table[15], unit), (127, 0.5 / 127.0));
    assert_eq!(q8avx2::lut4(&[0.0; 16]), ([0; 16], 0.0));
}

#[test]
fn dense_layouts_match_the_reference_with_a_column_tail() {
    let (oc, ic) = (37, 83);
    let s = stored(&mut Rng::new(1), oc, ic + 1, 0);
    check_all("f32", &QWeight::F32(&s.f32s[..oc * ic]), ic, oc);
    check_all("bf16", &QWeight::Bf16(&s.bf16s[..oc * ic]), ic, oc);
    let int8 = QWeight::Int8 {
        codes: &s.i8s[..oc * ic],
        scales: &s.h_scales[..oc],
    };
    check_all("int8", &int8, ic, oc);
    // Whole blocks of 32: the AVX2 path's integer kernel.
    let (oc, ic) = (37, 96);
    let s = stored(&mut Rng::new(2), oc, ic, 0);
    let int8 = QWeight::Int8 {
        codes: &s.i8s,
        scales: &s.h_scales[..oc],
    };
    check_all("int8 whole blocks", &int8, ic, oc);
}

#[test]
fn four_bit_rows_of_odd_blocks_or_groups_of_96_match_the_reference() {
    // 5 blocks a row, and groups that are not pairs of blocks: the integer kernel's one-block
    // loops (every other int4 and nf4 case runs them on pairs).
    for (oc, ic, group) in [(19, 160, 32), (7, 384, 96)] {
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64), oc, ic, groups);
        for zeros in [None, Some(&s.zeros[..])] {
            let w = QWeight::Int4 {
                codes: &s.u8s,
                scales: &s.h_scales[..groups],
                zeros,
                group,
            };
            check_all(&format!("int4 ic={ic} g{group}"), &w, ic, oc);
        }
        let nf4 = QWeight::Nf4 {
            codes: &s.u8s,
            scales: &s.f_scales,
            levels: &NF4,
            group,
        };
        check_all(&format!("nf4 ic={ic} g{group}"), &nf4, ic, oc);
    }
}

#[test]
fn nibble_layouts_match_the_reference_for_every_group_size() {
    let (oc, ic) = (29, 256);
    for group in [32, 64, 128] {
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(group as u64), oc, ic, groups);
        let sym = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: None,
            group,
        };
        check_all("int4", &sym, ic, oc);
        let asym = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: Some(&s.zeros),
            group,
        };
        check_all("int4 asym", &asym, ic, oc);
        let nf4 = QWeight::Nf4 {
            codes: &s.u8s,
            scales: &s.f_scales,
            levels: &NF4,
            group,
        };
        check_all("nf4", &nf4, ic, oc);
    }
}

#[test]
fn groups_that_straddle_a_128_weight_chunk_take_a_path_that_handles_them() {
    // Groups of 96 and 192: a VNNI chunk of 128 would span two groups.
    let (oc, ic) = (5, 384);
    for group in [96, 192] {
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(3), oc, ic, groups);
        let w = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: None,
            group,
        };
        let mut rng = Rng::new(4);
        let inp: Vec<f32> = (0..ic).map(|_| rng.uniform() as f32).collect();
        let mut want = vec![0.0f32; oc];
        #[cfg(target_arch = "x86_64")]
        if integer_weights(best_isa(), &w, ic).is_some() {
            // Groups of 96 take the AVX2 integer kernel: compare with its int8 activations.
            reference(&mut want, &avx2_activations(&inp, 1, ic), &w, 1, ic, oc);
        } else {
            reference(&mut want, &inp, &w, 1, ic, oc);
        }
        #[cfg(not(target_arch = "x86_64"))]
        reference(&mut want, &inp, &w, 1, ic, oc);
        let mut got = vec![0.0f32; oc];
        matmul(&mut got, &inp, &w, 1, ic, oc);
        for (g, e) in got.iter().zip(&want) {
            assert!(
                (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                "group {group}: {g} vs {e}"
            );
        }
    }
}

#[test]
fn nibbles_pack_in_sub_block_order() {
    let codes: Vec<u8> = (0..64).map(|i| (i % 16) as u8).collect();
    let packed = pack_nibbles(&codes);
    assert_eq!(packed.len(), 32);
    // Byte 0 holds weight 0 (low) and weight 16 (high).
    assert_eq!(packed[0], codes[0] | (codes[16] << 4));
    for (i, &c) in codes.iter().enumerate() {
        assert_eq!(nibble(&packed, i), c, "weight {i}");
    }
}

#[test]
fn int4_dequantizes_as_scale_times_code_minus_zero() {
    let codes = pack_nibbles(&[3u8; 32]);
    let scales = [f16::from_f32(0.5)];
    let sym = QWeight::Int4 {
        codes: &codes,
        scales: &scales,
        zeros: None,
        group: 32,
    };
    assert_eq!(sym.at(0, 5, 32), 0.5 * (3.0 - 8.0));
    let zeros = [1u8];
    let asym = QWeight::Int4 {
        codes: &codes,
        scales: &scales,
        zeros: Some(&zeros),
        group: 32,
    };
    assert_eq!(asym.at(0, 5, 32), 1.0);
}

#[test]
fn rows_that_end_in_half_a_128_weight_chunk_match_the_reference() {
    // SmolLM2's widths: 576 = 4.5 chunks of 128, 192 = 1.5 (its tensor-parallel slices).
    for (ic, group) in [(576, 32), (576, 64), (192, 32), (192, 64), (320, 32)] {
        let oc = 7;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64), oc, ic, groups);
        let w = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: None,
            group,
        };
        check_all(&format!("int4 ic={ic} group={group}"), &w, ic, oc);
    }
}

/// An int4 output's value is the same bits whatever rows share its pass (one, a decode batch,
/// a prompt's rows) and whatever the thread count, on every path: each output's sum runs in one
/// order, whatever the row count or the outputs a task takes. So a server's batch answers as
/// each request alone.
#[test]
fn int4_outputs_do_not_depend_on_the_rows_beside_them_or_the_threads() {
    // Pairs of blocks (groups of 32 and 128; 320: not whole 128-weight chunks), groups of 96
    // (one block at a time).
    for (ic, group, asym) in [
        (512, 32, false),
        (512, 128, true),
        (320, 64, false),
        (288, 96, true),
    ] {
        // Tasks of 18 outputs on two threads, 12 on three, and a last one of 13 or 1.
        let oc = 301;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64 + group as u64), oc, ic, groups);
        let w = QWeight::Int4 {
            codes: &s.u8s,
            scales: &s.h_scales[..groups],
            zeros: asym.then_some(&s.zeros[..]),
            group,
        };
        check_all("int4", &w, ic, oc);
        same_bits_whatever_rows_or_threads(&w, ic, oc);
    }
}

/// Each of 11 rows alone gives the bits it gives in one pass of all 11, and a 3-thread pool
/// the bits of the default one, on every path.
fn same_bits_whatever_rows_or_threads(w: &QWeight, ic: usize, oc: usize) {
    let n = 11;
    let mut rng = Rng::new(5);
    let inp: Vec<f32> = (0..n * ic).map(|_| rng.uniform() as f32 - 0.5).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for isa in isas() {
        let name = isa.name();
        let mut all = vec![0.0f32; n * oc];
        matmul_on(isa, &mut all, &inp, w, n, ic, oc);
        for r in 0..n {
            let mut one = vec![0.0f32; oc];
            matmul_on(isa, &mut one, &inp[r * ic..(r + 1) * ic], w, 1, ic, oc);
            let row = &all[r * oc..(r + 1) * oc];
            assert_eq!(bits(&one), bits(row), "{name} ic={ic} row {r}");
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let mut three = vec![0.0f32; n * oc];
        pool.install(|| matmul_on(isa, &mut three, &inp, w, n, ic, oc));
        assert_eq!(bits(&three), bits(&all), "{name} ic={ic}: 3 threads");
    }
}

#[test]
fn grouped_int8_with_and_without_minima_matches_the_reference() {
    // ggml's shapes: Q8_0/Q4_1-like groups of 32 with minima, Q6_K-like groups of 16 without,
    // and groups of 16 with minima (a Q4_K_M file's mix); SmolLM2's 576 and a 256-wide row.
    // 96: an odd number of blocks (the VNNI path's lone last block).
    let cases = [
        (576, 32, true),
        (256, 16, false),
        (576, 16, true),
        (96, 32, true),
        (96, 16, false),
    ];
    for (ic, group, with_mins) in cases {
        let oc = 11;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64 + group as u64), oc, ic, groups);
        let mins: Vec<f32> = s.f_scales.iter().map(|x| x - 0.5).collect();
        let w = QWeight::Grouped {
            codes: &s.i8s,
            scales: &s.f_scales,
            mins: with_mins.then_some(mins.as_slice()),
            group,
        };
        check_all(
            &format!("grouped ic={ic} group={group} mins={with_mins}"),
            &w,
            ic,
            oc,
        );
    }
}

#[test]
fn grouped_nibbles_give_the_results_of_their_int8_copy_bit_for_bit() {
    // ggml's 4-bit types packed two a byte: the same values as the same codes one a byte, and
    // the same sums on every path (the integer path's lanes see the same products).
    for (ic, group, with_mins) in [(576, 32, true), (256, 16, true), (96, 32, false)] {
        let oc = 13;
        let groups = oc * ic / group;
        let s = stored(&mut Rng::new(ic as u64 + 3), oc, ic, groups);
        let codes: Vec<u8> = s.u8s.iter().flat_map(|b| [b & 0xF, b >> 4]).collect();
        let packed = pack_nibbles(&codes);
        let as_i8: Vec<i8> = codes.iter().map(|&c| c as i8).collect();
        let mins: Vec<f32> = s.f_scales.iter().map(|x| -8.0 * x).collect();
        let mins = with_mins.then_some(mins.as_slice());
        let (scales, name) = (&s.f_scales, format!("grouped4 ic={ic} group={group}"));
        let w4 = QWeight::Grouped4 {
            codes: &packed,
            scales,
            mins,
            group,
        };
        let w8 = QWeight::Grouped {
            codes: &as_i8,
            scales,
            mins,
            group,
        };
        check_all(&name, &w4, ic, oc);
        let mut rng = Rng::new(11);
        for n in [1, 5, 8] {
            let inp: Vec<f32> = (0..n * ic).map(|_| rng.uniform() as f32).collect();
            for isa in isas() {
                let (mut a, mut b) = (vec![0.0f32; n * oc], vec![1.0f32; n * oc]);
                matmul_on(isa, &mut a, &inp, &w4, n, ic, oc);
                matmul_on(isa, &mut b, &inp, &w8, n, ic, oc);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{name} {} n={n}", isa.name());
            }
        }
    }
}
