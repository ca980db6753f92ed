//! The non-GEMM hot spots of a GPT-2 124M training step at B*T = 1024 rows, timed in one run:
//! the fused classifier (logits GEMM + softmax cross-entropy + two gradient GEMMs) at a few row
//! chunk sizes against the logits GEMM alone, and GELU forward/backward against the plain
//! reference loop (glibc's scalar `tanhf`). Prints a table; no assertions (speed is not a test).
//!
//! A third part times one AdamW step over 124M parameters (memory bound).
//!
//! Run: `cargo bench -p kernels --bench elementwise` (`-- gelu`, `-- classifier` or `-- adamw` for
//! one part).

mod common;

use kernels::classifier::Io;
use kernels::{classifier, gelu, matmul};

const N: usize = 1024;
const C: usize = 768;
const V: usize = 50257;

fn main() {
    common::cap_from_env();
    let args: Vec<String> = std::env::args().collect();
    let only = |name: &str| {
        !args
            .iter()
            .any(|a| a == "gelu" || a == "classifier" || a == "adamw")
            || args.iter().any(|a| a == name)
    };
    println!(
        "threads: {}, simd: {:?}",
        rayon::current_num_threads(),
        kernels::fastmath::simd()
    );
    if only("classifier") {
        bench_classifier();
    }
    if only("gelu") {
        bench_gelu();
    }
    if only("adamw") {
        bench_adamw();
    }
}

fn bench_classifier() {
    let (inp, wte) = (common::fill(N * C, 1, 2.0), common::fill(V * C, 2, 0.1));
    let targets: Vec<u32> = (0..N).map(|i| (i * 7919 % V) as u32).collect();
    let mut logits = vec![0.0f32; N * V];
    let gemm = common::median_secs(3, || {
        matmul::forward(&mut logits, &inp, &wte, None, (N, C, V))
    });
    drop(logits);
    let flops = 2.0 * (N * C * V) as f64;
    println!("\nclassifier N={N} C={C} V={V}");
    println!(
        "logits GEMM alone (N x V)   {:>8.3} s  {:>6.1} GFLOP/s",
        gemm,
        flops / gemm / 1e9
    );
    let mut losses = vec![0.0f32; N];
    let (mut dinp, mut dwte) = (vec![0.0f32; N * C], vec![0.0f32; V * C]);
    for rows in [64, 256, 1024] {
        let mut scratch = vec![0.0f32; rows * V];
        let fwd = common::median_secs(3, || {
            classifier::loss(&mut losses, &inp, &wte, &targets, &mut scratch, (N, C, V));
        });
        let fb = common::median_secs(3, || {
            let dw = Some(&mut dwte[..]);
            let (x, w, y) = (&inp, &wte, &targets);
            let io = Io::new(&mut losses, &mut dinp, dw, x, w, y, &mut scratch);
            classifier::forward_backward(io, (N, C, V), 1.0 / N as f32);
        });
        println!(
            "chunk {rows:>4} rows: loss {fwd:.3} s (softmax ~{:.3} s), fwd+bwd {fb:.3} s ({:.1} GFLOP/s over 3 GEMMs)",
            fwd - gemm,
            3.0 * flops / fb / 1e9
        );
    }
}

fn bench_gelu() {
    let n = N * 4 * C;
    let (x, g) = (common::fill(n, 3, 8.0), common::fill(n, 4, 1.0));
    let mut out = vec![0.0f32; n];
    let mut d = vec![0.0f32; n];
    let fwd = common::median_secs(5, || gelu::forward(&mut out, &x));
    let bwd = common::median_secs(5, || gelu::backward(&mut d, &x, &g));
    let fwd_ref = common::median_secs(3, || gelu::reference::forward(&mut out, &x));
    let bwd_ref = common::median_secs(3, || gelu::reference::backward(&mut d, &x, &g));
    println!("\ngelu over {n} elements (N x 4C)");
    println!(
        "forward : kernel {:.2} ms, reference (1 thread) {:.2} ms, ratio {:.1}x",
        fwd * 1e3,
        fwd_ref * 1e3,
        fwd_ref / fwd
    );
    println!(
        "backward: kernel {:.2} ms, reference (1 thread) {:.2} ms, ratio {:.1}x",
        bwd * 1e3,
        bwd_ref * 1e3,
        bwd_ref / bwd
    );
}

/// One AdamW step over GPT-2 124M's parameter count: memory bound (16 bytes read, 12 written per
/// parameter), so reported as GB/s of that traffic.
fn bench_adamw() {
    let n = 124_439_808;
    let g = common::fill(n, 5, 1e-3);
    let (mut p, mut m, mut v) = (common::fill(n, 6, 0.1), vec![0.0f32; n], vec![0.0f32; n]);
    let opt = kernels::adamw::AdamW::default();
    let mut step = 0;
    let t = common::median_secs(3, || {
        step += 1;
        kernels::adamw::update(&mut p, &g, &mut m, &mut v, opt, step);
    });
    let adamw_rate = 28.0 * n as f64 / t / 1e9;
    // The machine's bandwidth in the same run, over the same 4 x 124M floats: a streaming read of
    // all of them, and STREAM's triad (read two, write one) over three of them.
    let read = common::median_secs(3, || {
        std::hint::black_box(kernels::stream::read_all(&p));
        std::hint::black_box(kernels::stream::read_all(&m));
        std::hint::black_box(kernels::stream::read_all(&v));
        std::hint::black_box(kernels::stream::read_all(&g));
    });
    let read_rate = 16.0 * n as f64 / read / 1e9;
    let triad = common::median_secs(3, || kernels::stream::triad(&mut m, &p, &g, 0.5));
    let triad_rate = 12.0 * n as f64 / triad / 1e9;
    println!(
        "\nadamw over {n} parameters: {:.1} ms, {adamw_rate:.1} GB/s (28 bytes per parameter)",
        t * 1e3
    );
    println!(
        "same run: streaming read {read_rate:.1} GB/s, triad {triad_rate:.1} GB/s; adamw = {:.2} x read, {:.2} x triad",
        adamw_rate / read_rate,
        adamw_rate / triad_rate
    );
}
