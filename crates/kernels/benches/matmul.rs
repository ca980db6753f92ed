//! GEMM throughput for the GPT-2 124M linear layers at B*T = 1024 rows: the engine's f32 path
//! (`matmul::capped::path`: the crate's AVX-512 kernel from the `avx512` level up, else faer's;
//! the plain loop without AVX2)
//! against faer's GEMM and the plain reference loop, in one run, as GFLOP/s and ratios, plus the
//! fraction of the machine's fp32 peak. Prints a table; no assertions (speed is not a test).
//!
//! The `faer-par` column is faer's GEMM with its own `Par::rayon` split (no bias); `fwd/faer` is
//! the engine's forward against it.
//!
//! Run: `cargo bench -p kernels --bench matmul` (set PEAK_GFLOPS to override the peak used for
//! the last column; default 460 = ~230 GFLOP/s per core × 2 cores, AVX-512 FMA).
//!
//! A second table times the bf16-input GEMM (`gemm_bf16`, f32 accumulate) on every path the CPU
//! runs (AMX, AVX-512 BF16, portable), against faer's f32 GEMM on the same shape, and (`bwd
//! GF/s`) the backward as the engine runs it on the best path: `gemm_nn` for the input and weight
//! gradients around the output gradient's transpose.
//!
//! A third times the fused classifier (logits, loss, both backward GEMMs) of GPT-2 124M at
//! 1024 rows in chunks of 64 and 256: f32 (`classifier::forward_backward`) against bf16
//! (`classifier::bf16`, which reads the token table in bf16 in place), at 6·N·C·V FLOPs.
//!
//! `cargo bench -p kernels --bench matmul -- bf16` runs the second and third tables only.
//!
//! The reference loop runs on the first 32 rows only (its rate does not depend on the row count
//! and the full classifier would take minutes); faer runs on all rows.

mod common;

use kernels::classifier::Io;
use kernels::gemm_bf16::{self, bf16, Accum, Isa};
use kernels::matmul;

const N: usize = 1024;
const REF_ROWS: usize = 32;

const SHAPES: [(&str, usize, usize); 5] = [
    ("qkv", 768, 2304),
    ("attn.proj", 768, 768),
    ("fc", 768, 3072),
    ("fc.proj", 3072, 768),
    ("lm_head", 768, 50257),
];

fn main() {
    common::cap_from_env();
    if std::env::args().any(|a| a == "bf16") {
        bench_bf16();
        return bench_classifier();
    }
    let peak: f64 = std::env::var("PEAK_GFLOPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(460.0);
    println!(
        "threads: {}, peak used: {peak} GFLOP/s, engine's f32 path: {}",
        rayon::current_num_threads(),
        matmul::capped::path().name()
    );
    println!(
        "{:<10} {:>5} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "layer",
        "IC",
        "OC",
        "ref GF/s",
        "faer-par",
        "fwd GF/s",
        "bwd GF/s",
        "fwd/ref",
        "fwd/peak",
        "fwd/faer"
    );
    let shapes = [
        ("qkv", 768, 2304),
        ("attn.proj", 768, 768),
        ("fc", 768, 3072),
        ("fc.proj", 3072, 768),
        ("lm_head", 768, 50257),
    ];
    for (name, ic, oc) in shapes {
        let (inp, w, bias) = (
            common::fill(N * ic, 1, 1.0),
            common::fill(oc * ic, 2, 1.0),
            common::fill(oc, 3, 1.0),
        );
        let mut out = vec![0.0f32; N * oc];
        let flops = 2.0 * (N * ic * oc) as f64;
        let reps = if oc > 10_000 { 3 } else { 5 };
        let fwd = common::median_secs(reps, || {
            matmul::forward(&mut out, &inp, &w, Some(&bias), (N, ic, oc))
        });
        // faer's own rayon split (what the kernel called before it cut slabs itself), no bias.
        let faer_par = common::median_secs(reps, || {
            faer::linalg::matmul::matmul(
                faer::MatMut::from_row_major_slice_mut(&mut out, N, oc),
                faer::Accum::Replace,
                faer::MatRef::from_row_major_slice(&inp, N, ic),
                faer::MatRef::from_row_major_slice(&w, oc, ic).transpose(),
                1.0,
                faer::Par::rayon(0),
            )
        });
        let (mut dinp, mut dw, mut db) = (
            vec![0.0f32; N * ic],
            vec![0.0f32; oc * ic],
            vec![0.0f32; oc],
        );
        let bwd = common::median_secs(reps, || {
            matmul::backward(
                &mut dinp,
                &mut dw,
                Some(&mut db),
                &out,
                &inp,
                &w,
                (N, ic, oc),
            )
        });
        let mut out_ref = vec![0.0f32; REF_ROWS * oc];
        let refs = common::median_secs(1, || {
            matmul::reference::forward(
                &mut out_ref,
                &inp[..REF_ROWS * ic],
                &w,
                Some(&bias),
                (REF_ROWS, ic, oc),
            )
        });
        let ref_gf = 2.0 * (REF_ROWS * ic * oc) as f64 / refs / 1e9;
        let (fwd_gf, bwd_gf) = (flops / fwd / 1e9, 2.0 * flops / bwd / 1e9);
        println!(
            "{name:<10} {ic:>5} {oc:>6} {ref_gf:>10.1} {:>10.1} {fwd_gf:>10.1} {bwd_gf:>10.1} {:>7.1}x {:>7.0}% {:>8.2}x",
            flops / faer_par / 1e9,
            fwd_gf / ref_gf,
            100.0 * fwd_gf / peak,
            faer_par / fwd
        );
    }
    bench_bf16();
    bench_classifier();
}

/// The classifier, f32 against bf16, per chunk size.
fn bench_classifier() {
    use kernels::classifier;
    let (c, v) = (768, 50257);
    println!("\nfused classifier, N = {N}, C = {c}, V = {v} (forward + backward)");
    println!(
        "{:<8} {:>10} {:>10} {:>10}",
        "chunk", "f32 GF/s", "bf16 GF/s", "bf16/f32"
    );
    let inp = common::fill(N * c, 4, 1.0);
    let wte = common::fill(v * c, 5, 0.1);
    let wte_h: Vec<bf16> = wte.iter().map(|&x| bf16::from_f32(x)).collect();
    let targets: Vec<u32> = (0..N as u32).map(|i| (i * 7919) % v as u32).collect();
    let (mut losses, mut dinp, mut dwte) =
        (vec![0.0f32; N], vec![0.0f32; N * c], vec![0.0f32; v * c]);
    // The bf16 classifier writes the 2-byte table gradient directly.
    let mut dwte_h = vec![bf16::ZERO; v * c];
    let flops = 6.0 * (N * c * v) as f64;
    for rows in [64, 256] {
        let mut scratch = vec![0.0f32; rows * v];
        let f32_s = common::median_secs(3, || {
            let dw = Some(&mut dwte[..]);
            let (x, w, y) = (&inp, &wte, &targets);
            let io = Io::new(&mut losses, &mut dinp, dw, x, w, y, &mut scratch);
            classifier::forward_backward(io, (N, c, v), 1.0 / N as f32);
        });
        let mut raw = vec![bf16::ZERO; rows * classifier::bf16::scratch_bytes_per_row(c, v) / 2];
        let bf16_s = common::median_secs(3, || {
            let dw = Some(&mut dwte_h[..]);
            let (x, w, y) = (&inp, &wte_h, &targets);
            let io = Io::new(&mut losses, &mut dinp, dw, x, w, y, &mut raw);
            classifier::bf16::forward_backward(io, (N, c, v), 1.0 / N as f32, None);
        });
        let (f, b) = (flops / f32_s / 1e9, flops / bf16_s / 1e9);
        println!("{rows:<8} {f:>10.1} {b:>10.1} {:>9.2}x", b / f);
    }
}

/// bf16 inputs, f32 accumulate, against faer f32 on the same shape: the forward on every path
/// this CPU runs, the backward on the best one.
fn bench_bf16() {
    let isas = gemm_bf16::supported();
    let best = gemm_bf16::best_isa();
    println!("\nbf16 GEMM (f32 accumulate); paths on this CPU: {isas:?}, best: {best:?}");
    let mut head = format!("{:<10} {:>10}", "layer", "f32 GF/s");
    for isa in isas {
        head += &format!(" {:>12}", format!("{isa:?}"));
    }
    head += &format!(" {:>10} {:>12} {:>9}", "best/f32", "bwd GF/s", "bwd/f32");
    println!("{head}");
    for (name, ic, oc) in SHAPES {
        let (inp, w) = (common::fill(N * ic, 1, 1.0), common::fill(oc * ic, 2, 1.0));
        let (inp_h, w_h): (Vec<bf16>, Vec<bf16>) = (
            inp.iter().map(|&x| bf16::from_f32(x)).collect(),
            w.iter().map(|&x| bf16::from_f32(x)).collect(),
        );
        let mut out = vec![0.0f32; N * oc];
        let flops = 2.0 * (N * ic * oc) as f64;
        let reps = if oc > 10_000 { 3 } else { 5 };
        let f32_gf = flops
            / common::median_secs(reps, || {
                matmul::forward(&mut out, &inp, &w, None, (N, ic, oc))
            })
            / 1e9;
        let mut run = |isa: Isa| {
            let reps = if isa == Isa::Portable { 1 } else { reps };
            flops
                / common::median_secs(reps, || {
                    gemm_bf16::gemm_nt_on(isa, &mut out, &inp_h, &w_h, (N, oc, ic), Accum::Replace)
                })
                / 1e9
        };
        let rates: Vec<f64> = isas.iter().map(|&isa| run(isa)).collect();
        // The backward as the engine runs it: dinp = g·W and dW = gᵀ·x with `gemm_nn`.
        let g: Vec<bf16> = (0..N * oc)
            .map(|i| bf16::from_f32(((i % 7) as f32 - 3.0) * 0.1))
            .collect();
        let (mut gt, mut dinp, mut dw) = (g.clone(), vec![0.0f32; N * ic], vec![0.0f32; oc * ic]);
        let bwd = 2.0 * flops
            / common::median_secs(reps, || {
                gemm_bf16::gemm_nn(&mut dinp, &g, &w_h, (N, ic, oc), Accum::Replace);
                gemm_bf16::transpose(&mut gt, &g, N, oc);
                gemm_bf16::gemm_nn(&mut dw, &gt, &inp_h, (oc, ic, N), Accum::Replace);
            })
            / 1e9;
        let mut row = format!("{name:<10} {f32_gf:>10.1}");
        for r in &rates {
            row += &format!(" {r:>12.1}");
        }
        // The path `best_isa` picked (FRUGAL_ISA may cap it), which the backward ran.
        let best_rate = rates[isas.iter().position(|&i| i == best).unwrap_or(0)];
        row += &format!(
            " {:>9.2}x {bwd:>12.1} {:>8.2}x",
            best_rate / f32_gf,
            bwd / f32_gf
        );
        println!("{row}");
    }
}
