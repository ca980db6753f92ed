//! Weight-only quantized GEMV/GEMM at Llama-2-7B's layer shapes (4096 → 11008 and back), every
//! stored layout on every path this CPU runs, at 1 and 8 activation rows, against a streaming
//! read of a 1 GiB buffer timed in the same run: each line reports the weight bytes read per
//! second and that as a fraction of the measured bandwidth. No assertions (speed is not a test).
//! `QM_ONLY=int8,int8t` runs only the formats named (a `t`: the same codes in tiles).
//!
//! Also one core's issue rate of 512-bit FMAs and `vpdpbusd`s (the ceiling of the batched,
//! compute-bound case) and, with `QM_MODEL=1` (or `int8`), one pass over a model's worth of
//! distinct matrices. Where the AVX2 path runs, its 8-row tile lines also report the fraction
//! of their ceiling: the rate at which one core issues their multiplies ([`Ceiling`]).
//!
//! Run: `cargo bench -p kernels --bench qmatmul`.

mod common;

use half::{bf16, f16};
use kernels::qmatmul::{self, best_isa, matmul_on, Isa, QWeight};

const IC: usize = 4096;
const OC: usize = 11008;

fn main() {
    common::cap_from_env();
    let isas = qmatmul::supported();
    if std::env::var("QM_MODEL").is_ok() {
        return model_pass();
    }
    println!(
        "threads: {}, best isa: {:?}",
        rayon::current_num_threads(),
        best_isa()
    );
    #[cfg(target_arch = "x86_64")]
    if best_isa() == Isa::Avx512Vnni {
        // SAFETY: the CPU has AVX-512 F, BW and VNNI (best_isa).
        let (fma, dp) = unsafe { peak_rates() };
        println!("one core's issue rate: {fma:.2} G zmm FMA/s, {dp:.2} G vpdpbusd/s");
    }
    #[cfg(target_arch = "x86_64")]
    let ceiling = isas.contains(&Isa::Avx2).then(|| {
        // SAFETY: the CPU runs the AVX2 level (AVX2 and FMA).
        let c = unsafe { Ceiling::measure() };
        println!(
            "one core's issue rate: {:.2} G ymm FMA/s, {:.2} G vpmaddubsw/s, {:.2} G/s of the \
             tiles' multiply mix; the AVX2 8-row tiles' ceiling on {} threads: int4t g32 {:.0} \
             GMAC/s, g128 {:.0}, int8t {:.0}",
            c.fma,
            c.maddubs,
            c.mix,
            rayon::current_num_threads(),
            c.gmacs(Tile::Int4 { group: 32 }),
            c.gmacs(Tile::Int4 { group: 128 }),
            c.gmacs(Tile::Int8)
        );
        c
    });
    #[cfg(not(target_arch = "x86_64"))]
    let ceiling: Option<()> = None;
    let bw = common::streaming_read();
    let n = OC * IC;
    let f32s = common::fill(n, 1, 0.1);
    let bf16s: Vec<bf16> = f32s.iter().map(|&x| bf16::from_f32(x)).collect();
    let i8s: Vec<i8> = (0..n).map(|i| (i % 255) as i8).collect();
    let u8s: Vec<u8> = (0..n / 2).map(|i| (i * 7 % 256) as u8).collect();
    let mut tiled = vec![0u8; u8s.len()];
    qmatmul::tiles::tile_codes(&u8s, &mut tiled, OC, IC);
    let raw8: Vec<u8> = i8s.iter().map(|&c| c as u8).collect();
    let mut tiled8 = vec![0u8; n];
    qmatmul::tiles::tile_codes8(&raw8, &mut tiled8, OC, IC);
    let tiled8: Vec<i8> = tiled8.into_iter().map(|c| c as i8).collect();
    let h_row: Vec<f16> = (0..OC).map(|_| f16::from_f32(0.01)).collect();
    let levels: [f32; 16] = std::array::from_fn(|i| i as f32 / 8.0 - 1.0);
    let only = std::env::var("QM_ONLY").ok();
    let mut ran = 0;
    for group in [32usize, 128] {
        let h_g: Vec<f16> = (0..n / group).map(|_| f16::from_f32(0.01)).collect();
        let f_g: Vec<f32> = vec![0.01; n / group];
        let mut formats: Vec<(String, QWeight)> = vec![
            ("f32".into(), QWeight::F32(&f32s)),
            ("bf16".into(), QWeight::Bf16(&bf16s)),
            (
                "int8".into(),
                QWeight::Int8 {
                    codes: &i8s,
                    scales: &h_row,
                },
            ),
            (
                // The same codes in tiles of eight rows.
                "int8t".into(),
                QWeight::Int8Tiled {
                    codes: &tiled8,
                    scales: &h_row,
                },
            ),
            (
                format!("int4 g{group}"),
                QWeight::Int4 {
                    codes: &u8s,
                    scales: &h_g,
                    zeros: None,
                    group,
                },
            ),
            (
                // The same codes in tiles of eight rows (the integer kernel's layout).
                format!("int4t g{group}"),
                QWeight::Int4Tiled {
                    codes: &tiled,
                    scales: &h_g,
                    zeros: None,
                    group,
                },
            ),
            (
                format!("nf4 g{group}"),
                QWeight::Nf4 {
                    codes: &u8s,
                    scales: &f_g,
                    levels: &levels,
                    group,
                },
            ),
            (
                // In int4's tiles (its scales all alike, so their order is moot here).
                format!("nf4t g{group}"),
                QWeight::Nf4Tiled {
                    codes: &tiled,
                    scales: &f_g,
                    levels: &levels,
                    group,
                },
            ),
        ];
        if group == 32 {
            // A GGUF file's blocks as the engine runs them: a scale and a minimum per 32.
            formats.push((
                "ggml g32".into(),
                QWeight::Grouped {
                    codes: &i8s,
                    scales: &f_g,
                    mins: Some(&f_g),
                    group,
                },
            ));
            // Its 4-bit types, codes two a byte.
            formats.push((
                "ggml4 g32".into(),
                QWeight::Grouped4 {
                    codes: &u8s,
                    scales: &f_g,
                    mins: Some(&f_g),
                    group,
                },
            ));
        }
        for (name, w) in &formats {
            if group != 32 && !name.contains('g') {
                continue;
            }
            // QM_ONLY=int8,int8t: only the formats named (before any space).
            let head = name.split(' ').next().unwrap_or_default();
            if only
                .as_ref()
                .is_some_and(|o| !o.split(',').any(|x| x == head))
            {
                continue;
            }
            ran += 1;
            for &isa in &isas {
                // VNNI changes only the integer layouts (int4, int8, nf4, ggml's blocks).
                let integer = !name.starts_with('f') && !name.starts_with("bf");
                if matches!(isa, Isa::Avx512Vnni | Isa::Avx2Vnni) && !integer {
                    continue;
                }
                // Tiles are the integer path's layout; a plain loop reads them weight by weight.
                if isa == Isa::Portable && head.ends_with('t') {
                    continue;
                }
                for rows in [1usize, 8] {
                    let inp = common::fill(rows * IC, 2, 1.0);
                    let mut out = vec![0.0f32; rows * OC];
                    let reps = if isa == Isa::Portable { 1 } else { 7 };
                    let t = common::median_secs(reps, || {
                        matmul_on(isa, &mut out, &inp, w, rows, IC, OC)
                    });
                    let bytes = w.bytes() as f64;
                    let macs = (rows * n) as f64 / t / 1e9;
                    // The AVX2 tiles at 8 rows are compute-bound: their fraction of the ceiling.
                    #[cfg(target_arch = "x86_64")]
                    let of_ceiling = match (&ceiling, isa, rows, head) {
                        (Some(c), Isa::Avx2, 8, "int4t") => {
                            let tile = Tile::Int4 { group };
                            format!("  {:.2} of ceiling", macs / c.gmacs(tile))
                        }
                        (Some(c), Isa::Avx2, 8, "int8t") => {
                            format!("  {:.2} of ceiling", macs / c.gmacs(Tile::Int8))
                        }
                        _ => String::new(),
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let of_ceiling = {
                        let _ = &ceiling;
                        String::new()
                    };
                    println!(
                        "{name:<10} {:<9} rows {rows}  {:>8.2} ms  {:>6.2} GB/s  \
                         {:>5.1}% of read  {:>7.1} GFLOP/s{of_ceiling}",
                        isa.name(),
                        t * 1e3,
                        bytes / t / 1e9,
                        100.0 * bytes / t / bw,
                        2.0 * macs
                    );
                }
            }
        }
    }
    if let (Some(o), 0) = (&only, ran) {
        eprintln!(
            "QM_ONLY={o} names no format: give some of f32, bf16, int8, int8t, int4, int4t, \
             nf4, nf4t, ggml, ggml4 (comma-separated)"
        );
        std::process::exit(2);
    }
    let _ = qmatmul::ROWS;
}

/// A model's worth of distinct int4 matrices (32 × 4096 × 11008, 720 MB; `QM_MODEL=int8`: int8,
/// 16 of them, 720 MB too): one pass, as a decode step reads them, in rows and in tiles of eight
/// rows, alternately.
#[allow(dead_code)]
pub fn model_pass() {
    let int8 = std::env::var("QM_MODEL").is_ok_and(|m| m == "int8");
    let n = IC * OC;
    let (count, per) = if int8 { (16, n) } else { (32, n / 2) };
    let mats: Vec<Vec<u8>> = (0..count)
        .map(|m| (0..per).map(|i| ((i * 7 + m) % 256) as u8).collect())
        .collect();
    let groups = if int8 { OC } else { n / 32 };
    let scales: Vec<f16> = vec![f16::from_f32(0.01); groups];
    let inp = common::fill(IC, 2, 1.0);
    let mut out = vec![0.0f32; OC];
    let bytes = (count * (per + 2 * groups)) as f64;
    let kind = if int8 { "int8" } else { "int4" };
    for round in 0..2 {
        for layout in ["rows", "tiles"] {
            let t = common::median_secs(3, || {
                for m in &mats {
                    // The pattern's bytes serve as either layout: both read the same amount.
                    let i8s = || {
                        // SAFETY: u8 and i8 have one layout.
                        unsafe { std::slice::from_raw_parts(m.as_ptr() as *const i8, m.len()) }
                    };
                    let w = match (int8, layout) {
                        (true, "rows") => QWeight::Int8 {
                            codes: i8s(),
                            scales: &scales,
                        },
                        (true, _) => QWeight::Int8Tiled {
                            codes: i8s(),
                            scales: &scales,
                        },
                        (false, "rows") => QWeight::Int4 {
                            codes: m,
                            scales: &scales,
                            zeros: None,
                            group: 32,
                        },
                        _ => QWeight::Int4Tiled {
                            codes: m,
                            scales: &scales,
                            zeros: None,
                            group: 32,
                        },
                    };
                    kernels::qmatmul::matmul(&mut out, &inp, &w, 1, IC, OC);
                }
            });
            println!(
                "model pass {round}, {kind} {layout:<5}: {:.2} GB/s over {count} matrices",
                bytes / t / 1e9
            );
        }
    }
}

/// One core's throughput of independent 512-bit FMAs and `vpdpbusd`s (12 chains each): the
/// ceiling the compute-bound batched paths are measured against.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn peak_rates() -> (f64, f64) {
    use std::arch::x86_64::*;
    let (b, c) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999));
    let fma = chain_rate(_mm512_set1_ps(1.0), |x| _mm512_fmadd_ps(x, b, c));
    let (u, v) = (_mm512_set1_epi8(3), _mm512_set1_epi8(5));
    let dp = chain_rate(_mm512_set1_epi32(1), |x| _mm512_dpbusd_epi32(x, u, v));
    (fma, dp)
}

/// Steps a second, in G, of 12 independent chains of `step` from `start`, each stepped 20
/// million times: one instruction's throughput where `step` is one instruction.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chain_rate<T: Copy>(start: T, step: impl Fn(T) -> T) -> f64 {
    let n = 20_000_000usize;
    let t = std::time::Instant::now();
    let mut x = [start; 12];
    for _ in 0..n {
        for v in x.iter_mut() {
            *v = step(*v);
        }
    }
    std::hint::black_box(x);
    (12 * n) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// One core's issue rates, G instructions a second (12 independent chains each): ymm FMAs,
/// `vpmaddubsw`s, and the mix an AVX2 tile's multiplies make (FMAs, `vpmaddubsw`, `vpmaddwd`,
/// `vpsignb` and `vmulps` chains side by side). Where those share ports the mix runs no faster
/// than FMAs alone (on Zen 4 it runs at about their rate), and it bounds a tile. `vcvtdq2ps` is
/// not counted: on Zen 4 it runs beside `vpmaddubsw` at the full rate of each. With two threads
/// a core (SMT) the threads share one core's rate: halve the ceiling.
#[cfg(target_arch = "x86_64")]
struct Ceiling {
    fma: f64,
    maddubs: f64,
    mix: f64,
}

#[cfg(target_arch = "x86_64")]
impl Ceiling {
    /// The mix's instructions an 8-row tile issues per activation row and 256 products (a tile
    /// sub-block). int4 ([`Tile::Int4`]): 8 `vpmaddubsw`, a `vpmaddwd`, the scale's multiply and
    /// FMA, and per group the zero point's FMA. int8: 8 `vpsignb`, 8 `vpmaddubsw`, 8 `vpmaddwd`,
    /// an FMA, and the block's 8 `vpsignb` (|w|, once for the 8 rows).
    fn per_row(tile: Tile) -> f64 {
        match tile {
            Tile::Int4 { group } => 11.0 + 32.0 / group as f64,
            Tile::Int8 => 26.0,
        }
    }

    /// G products a second on every thread.
    fn gmacs(&self, tile: Tile) -> f64 {
        self.mix * 256.0 / Ceiling::per_row(tile) * rayon::current_num_threads() as f64
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn measure() -> Ceiling {
        use std::arch::x86_64::*;
        // Opaque, so that no chain folds away (a sign by a known positive is a no-op).
        let (b, c) = std::hint::black_box((_mm256_set1_ps(1.000_000_1), _mm256_set1_ps(0.999)));
        let u = std::hint::black_box(_mm256_set1_epi8(3));
        let fma = chain_rate(_mm256_set1_ps(1.0), |x| _mm256_fmadd_ps(x, b, c));
        let maddubs = chain_rate(u, |x| _mm256_maddubs_epi16(u, x));
        let n = 20_000_000usize;
        // 3 FMA, 3 vpmaddubsw, 2 vpmaddwd, 2 vpsignb and 2 vmulps chains.
        let t = std::time::Instant::now();
        let (mut f, mut m) = ([_mm256_set1_ps(1.0); 3], [_mm256_set1_ps(1.0); 2]);
        let (mut d, mut w, mut g) = ([u; 3], [u; 2], [u; 2]);
        for _ in 0..n {
            for x in f.iter_mut() {
                *x = _mm256_fmadd_ps(*x, b, c);
            }
            for x in d.iter_mut() {
                *x = _mm256_maddubs_epi16(u, *x);
            }
            for x in w.iter_mut() {
                *x = _mm256_madd_epi16(*x, u);
            }
            for x in g.iter_mut() {
                *x = _mm256_sign_epi8(*x, u);
            }
            for x in m.iter_mut() {
                *x = _mm256_mul_ps(*x, b);
            }
        }
        std::hint::black_box((f, m, d, w, g));
        let mix = (12 * n) as f64 / t.elapsed().as_secs_f64() / 1e9;
        Ceiling { fma, maddubs, mix }
    }
}

/// The AVX2 tiles [`Ceiling`] bounds.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Tile {
    Int4 { group: usize },
    Int8,
}
