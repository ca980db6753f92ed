//! Host optimizer step throughput (elements/s) for `--offload optimizer`, against a plain scalar
//! loop in the same run: the offloaded AdamW (`precision::adamw_master_step`: vectorised, rayon
//! over chunks) with f32 gradients, with bf16 gradients in and a bf16 working copy out, on a
//! memory-mapped file, and `kernels::adamw::update` for reference.
//!
//! Run: `cargo bench -p engine --bench offload` (optional argument: elements, default 2^23).
//! Prints one line per variant with elements/s and the ratio to the plain loop (best of 5).

use half::bf16;
use kernels::adamw::{self, AdamW};
use std::hint::black_box;
use std::time::Instant;
use train::offload::OffloadStore;
use train::precision::{adamw_master_step, Grads, MasterStep, Working};

const REPS: usize = 5;

/// The baseline: AdamW written as the textbook loop, one thread, indexed.
fn plain_loop(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], o: AdamW, step: u32) {
    let bc1 = 1.0 - o.beta1.powi(step as i32);
    let bc2 = 1.0 - o.beta2.powi(step as i32);
    for i in 0..p.len() {
        p[i] -= o.lr * o.weight_decay * p[i];
        m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
        v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
        let m_hat = m[i] / bc1;
        let v_hat = v[i] / bc2;
        p[i] -= o.lr * m_hat / (v_hat.sqrt() + o.eps);
    }
}

/// Best time of `REPS` runs of `f(step)`, in seconds.
fn best(mut f: impl FnMut(u32)) -> f64 {
    f(1); // warm the pages
    (0..REPS)
        .map(|r| {
            let t = Instant::now();
            f(r as u32 + 2);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1 << 23);
    let opt = AdamW::default();
    let g: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32 - 500.0) * 1e-5).collect();
    let g16: Vec<bf16> = g.iter().map(|&x| bf16::from_f32(x)).collect();
    let fresh = || (vec![0.1f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let step_of = |step| MasterStep {
        opt,
        step,
        grad_multiplier: 1.0,
    };

    let (mut p, mut m, mut v) = fresh();
    let plain = best(|s| plain_loop(&mut p, &g, &mut m, &mut v, opt, s));
    let (mut p, mut m, mut v) = fresh();
    let kernel = best(|s| adamw::update(&mut p, &g, &mut m, &mut v, opt, s));
    let (mut p, mut m, mut v) = fresh();
    let host =
        best(|s| adamw_master_step(&mut p, &mut m, &mut v, Grads::F32(&g), None, step_of(s)));
    let (mut p, mut m, mut v) = fresh();
    let mut working = vec![bf16::ZERO; n];
    let host_bf16 = best(|s| {
        let w = Some(Working::Bf16(&mut working));
        adamw_master_step(&mut p, &mut m, &mut v, Grads::Bf16(&g16), w, step_of(s))
    });
    let path = std::env::temp_dir().join(format!("frugal-bench-offload-{}", std::process::id()));
    let mut store = OffloadStore::on_disk(&path, &[n as u64]).expect("scratch file");
    let disk = best(|s| {
        let w = Some(Working::Bf16(&mut working));
        store.step_unit(0, Grads::Bf16(&g16), w, step_of(s))
    });
    black_box((&p, &working));
    drop(store);

    println!(
        "offload AdamW step, {n} elements, best of {REPS}, {} rayon threads",
        rayon::current_num_threads()
    );
    let rows = [
        ("plain scalar loop (baseline)", plain),
        ("kernels::adamw::update", kernel),
        ("host step, f32 grads", host),
        ("host step, bf16 grads -> bf16 working", host_bf16),
        ("host step on mmap file, bf16", disk),
    ];
    for (name, secs) in rows {
        println!(
            "{name:<40} {:>8.1} M elements/s  {:>5.2}x",
            n as f64 / secs / 1e6,
            plain / secs
        );
    }
}
