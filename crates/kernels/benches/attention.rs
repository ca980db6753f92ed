//! Flash against materialised causal attention, forward + backward, GPT-2 124M head shape
//! (B = 1, NH = NKV = 12, HD = 64), for T = 256…2048 (or the T values given as arguments):
//! median time of each and the extra memory each needs beyond the shared qkv/out/gradients —
//! materialised: `att` + `datt` (2 · B·NH·T² f32); flash: `lse` (B·NH·T f32) plus its fixed
//! per-thread stack tiles. Prints a table; no assertions.
//!
//! Run: `cargo bench -p kernels --bench attention [-- 256 4096]`.

mod common;

use kernels::attention::Shape;
use kernels::{attention, flash};

const B: usize = 1;
const NH: usize = 12;
const HD: usize = 64;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn main() {
    common::cap_from_env();
    let ts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ts = if ts.is_empty() {
        vec![256, 512, 1024, 2048]
    } else {
        ts
    };
    let threads = rayon::current_num_threads();
    println!("B={B} NH={NH} NKV={NH} HD={HD}, {threads} threads; times are forward+backward medians of 3");
    println!(
        "{:>6} {:>12} {:>12} {:>8} {:>14} {:>14} {:>10}",
        "T", "naive ms", "flash ms", "speedup", "naive MiB", "flash MiB", "mem ratio"
    );
    for t in ts {
        let r = 3 * NH * HD;
        let (qkv, dout) = (
            common::fill(B * t * r, 1, 1.0),
            common::fill(B * t * NH * HD, 2, 1.0),
        );
        let (mut out, mut dqkv) = (vec![0.0f32; B * t * NH * HD], vec![0.0f32; qkv.len()]);
        let (mut att, mut datt) = (vec![0.0f32; B * NH * t * t], vec![0.0f32; B * NH * t * t]);
        let naive = common::median_secs(3, || {
            attention::forward(&mut out, &mut att, &qkv, Shape::causal(B, t, NH, NH, HD));
            attention::backward(
                &mut dqkv,
                &mut datt,
                &dout,
                &qkv,
                &att,
                Shape::causal(B, t, NH, NH, HD),
            );
        });
        let naive_bytes = (att.len() + datt.len()) * 4;
        drop((att, datt));
        let mut lse = vec![0.0f32; B * NH * t];
        let fl = common::median_secs(3, || {
            flash::forward(&mut out, &mut lse, &qkv, Shape::causal(B, t, NH, NH, HD));
            flash::backward(
                &mut dqkv,
                &dout,
                &out,
                &lse,
                &qkv,
                Shape::causal(B, t, NH, NH, HD),
            );
        });
        let flash_bytes = lse.len() * 4 + threads * flash::STACK_BYTES_PER_THREAD;
        println!(
            "{t:>6} {:>12.1} {:>12.1} {:>7.2}x {:>14.2} {:>14.3} {:>9.0}x",
            naive * 1e3,
            fl * 1e3,
            naive / fl,
            mib(naive_bytes),
            mib(flash_bytes),
            naive_bytes as f64 / flash_bytes as f64
        );
    }
}
