//! Dequantizing one frozen LoRA base matrix (Llama-2-7B's 11008 × 4096 MLP projection) in every
//! stored layout, against a streaming triad over buffers of the same size timed in the same run
//! (the machine's write-and-read bandwidth), and against the GEMM that then reads it (512 rows,
//! a QLoRA step's sequence): each line reports the bytes moved per second, that as a fraction of
//! the triad's, and the dequant's time as a share of the GEMM's. No assertions.
//!
//! Run: `cargo bench -p kernels --bench dequant`.

mod common;

use kernels::dequant::{dequantize, dequantize_range, Stored, NESTED_BLOCK};

const ROWS: usize = 11008;
const COLS: usize = 4096;
const N_TOKENS: usize = 512;

fn main() {
    common::cap_from_env();
    let n = ROWS * COLS;
    println!("threads: {}", rayon::current_num_threads());
    let (b, c) = (common::fill(n, 1, 1.0), common::fill(n, 2, 1.0));
    let mut a = vec![0.0f32; n];
    let t = common::median_secs(5, || kernels::stream::triad(&mut a, &b, &c, 0.5));
    let triad_bw = (12 * n) as f64 / t;
    drop((b, c));
    println!(
        "triad over 3 x {} MiB: {:.2} GB/s",
        (4 * n) >> 20,
        triad_bw / 1e9
    );
    let x = common::fill(N_TOKENS * COLS, 3, 1.0);
    let w = common::fill(n, 4, 0.02);
    let mut out = vec![0.0f32; N_TOKENS * ROWS];
    let gemm = common::median_secs(3, || {
        kernels::matmul::forward(&mut out, &x, &w, None, (N_TOKENS, COLS, ROWS))
    });
    println!(
        "GEMM {N_TOKENS} x {COLS} -> {ROWS}: {:.1} ms ({:.0} GFLOP/s)",
        1e3 * gemm,
        2.0 * (N_TOKENS * COLS * ROWS) as f64 / gemm / 1e9
    );
    let levels: [f32; 16] = std::array::from_fn(|i| i as f32 / 7.5 - 1.0);
    let map: [f32; 256] = std::array::from_fn(|i| (i as f32 - 128.0) / 128.0);
    for stored in [
        Stored::Bf16,
        Stored::Int8 { rows: ROWS },
        Stored::Nf4 {
            block: 64,
            double: false,
        },
        Stored::Nf4 {
            block: 64,
            double: true,
        },
        Stored::Grouped {
            group: 32,
            nibbles: true,
        },
    ] {
        let mut src: Vec<u8> = (0..stored.bytes(n))
            .map(|i| (i * 131 % 251) as u8)
            .collect();
        let finite = |src: &mut Vec<u8>, from: usize, count: usize| {
            for k in 0..count {
                src[from + 4 * k..from + 4 * k + 4].copy_from_slice(&0.05f32.to_le_bytes());
            }
        };
        match stored {
            Stored::Bf16 => src.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0x3F),
            Stored::Int8 { rows } => finite(&mut src, n, rows),
            Stored::Nf4 { double: false, .. } => finite(&mut src, n / 2, n / 64),
            Stored::Nf4 { double: true, .. } => finite(
                &mut src,
                n / 2 + n / 64,
                (n / 64).div_ceil(NESTED_BLOCK) + 1,
            ),
            Stored::Grouped { group, .. } => finite(&mut src, n / 2, 2 * n / group),
        }
        if let Stored::Nf4 { double: true, .. } = stored {
            // Dequant + GEMM: the whole matrix at once, against tiles of rows the GEMM reads
            // from cache (the engine's `DEQUANT_TILE_ROWS`).
            let whole_t = common::median_secs(3, || {
                dequantize(&mut a, &src, stored, &levels, &map);
                kernels::matmul::forward(&mut out, &x, &a, None, (N_TOKENS, COLS, ROWS));
            });
            for tile in [256, 1024, 2048] {
                let tiled = common::median_secs(3, || {
                    for r0 in (0..ROWS).step_by(tile) {
                        let rows = tile.min(ROWS - r0);
                        let w = &mut a[..rows * COLS];
                        dequantize_range(w, &src, stored, n, r0 * COLS, &levels, &map);
                        let cols = (r0, rows);
                        kernels::lora::forward_cols(
                            &mut out,
                            &x,
                            w,
                            None,
                            (N_TOKENS, COLS, ROWS),
                            cols,
                        );
                    }
                });
                println!(
                    "  dequant + GEMM: whole {:.1} ms, tiles of {tile} rows {:.1} ms ({:.2}x)",
                    1e3 * whole_t,
                    1e3 * tiled,
                    whole_t / tiled
                );
            }
        }
        let t = common::median_secs(5, || dequantize(&mut a, &src, stored, &levels, &map));
        let moved = (src.len() + 4 * n) as f64;
        println!(
            "{stored:?}: {:.1} ms, {:.2} GB/s moved ({:.2} of the triad), {:.1}% of the GEMM's time",
            1e3 * t,
            moved / t / 1e9,
            moved / t / triad_bw,
            100.0 * t / gemm
        );
    }
}
