//! "Nothing is allocated inside a step", checked: a counting global allocator records every heap
//! allocation made while `Trainer::step` runs (after a warm-up step), and a step of every
//! precision, ZeRO stage and recompute policy must allocate no tensor-sized block.
//!
//! The arena holds every tensor, so the only heap traffic left in a step is the thread pool's
//! bookkeeping (rayon's job queues grow in blocks of about 1.5 KiB as jobs are pushed: measured
//! 12-19 allocations of at most 1,520 bytes per step here); the test bounds that by size rather
//! than pretending it is zero: no single allocation as large as the smallest activation the
//! step's plan holds (4 KiB at 32 × 32 tokens), and under 64 KiB in all per step.
//!
//! Each case runs at every instruction-set level this CPU runs (`kernels::cpu`), so the AVX2 and
//! portable kernels are held to it on an AVX-512 machine too.

use engine::testkit::{count_allocations, Capped, Counting};
use kernels::cpu::Level;
use plan::buffer::{Category, Lifetime};
use plan::setup::{Attention, Recompute, ZeroStage};
use train::testkit::{config, deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny, tokens};
use train::Mixed;
use train::{TrainConfig, Trainer};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations (count, bytes, largest) of `steps` steps after two warm-up steps at `level`, and
/// the smallest activation the plan makes live during a step.
fn measure(cfg: TrainConfig, steps: usize, level: Level) -> (u64, u64, u64, u64) {
    let _capped = Capped::at(level);
    let n = (cfg.batch * cfg.seq) as usize;
    let (x, y) = (tokens(n, 96, 1), tokens(n, 96, 2));
    let mut t = Trainer::new(cfg).unwrap();
    let smallest = t
        .plan
        .buffers
        .iter()
        .filter(|b| b.lifetime != Lifetime::Persistent && b.category == Category::Activations)
        .map(|b| b.bytes)
        .min()
        .unwrap();
    t.init_weights(3);
    let mut feed = |i: &mut [u32], o: &mut [u32]| {
        i.copy_from_slice(&x);
        o.copy_from_slice(&y);
    };
    t.step(&mut feed).unwrap();
    t.step(&mut feed).unwrap();
    let (count, bytes, largest) = count_allocations(|| {
        for _ in 0..steps {
            t.step(&mut feed).unwrap();
        }
    });
    (count, bytes, largest, smallest)
}

/// Counting is process-wide, so both checks run in one test, one after the other: a measurement
/// here would count a second test's allocations, made beside it. Seen under QEMU: the step
/// check's list of cases growing to room for 32 `TrainConfig`s (17,152 bytes) landed in the
/// first-product check.
#[test]
fn nothing_tensor_sized_is_allocated_after_warming() {
    every_pool_thread_has_its_gemm_buffers_once_warmed();
    a_step_allocates_no_tensor();
}

fn a_step_allocates_no_tensor() {
    let steps = 4;
    let mut cases = Vec::new();
    for shape in [gpt2_tiny(), llama_tiny(), mixtral_tiny(), deepseek_tiny()] {
        for mixed in [Mixed::fp32(), Mixed::bf16()] {
            for (recompute, attention) in [
                (Recompute::None, Attention::Eager),
                (Recompute::Full, Attention::Flash),
                (Recompute::KeepMatmuls, Attention::Flash),
            ] {
                cases.push(TrainConfig {
                    recompute,
                    attention,
                    mixed: mixed.clone(),
                    ..config(shape.clone(), 32, 32)
                });
            }
        }
    }
    let mut stage3 = config(gpt2_tiny(), 32, 32);
    stage3.zero = ZeroStage::Zero3;
    cases.push(stage3);
    for (cfg, level) in cases.iter().flat_map(|c| {
        kernels::cpu::supported()
            .into_iter()
            .map(move |l| (c.clone(), l))
    }) {
        let what = format!(
            "{} {:?} {:?} {:?} {:?} at {level}",
            cfg.model.shape.name, cfg.mixed.precision, cfg.zero, cfg.recompute, cfg.attention
        );
        let (count, bytes, largest, smallest) = measure(cfg, steps, level);
        eprintln!("{what}: {count} allocations, {bytes} bytes, largest {largest} in {steps} steps");
        assert!(
            largest < smallest,
            "{what}: a {largest}-byte allocation inside a step (the plan's smallest \
             activation is {smallest} bytes)"
        );
        assert!(
            bytes < 64 * 1024 * steps as u64,
            "{what}: {bytes} bytes in {steps} steps"
        );
    }
}

/// The libraries' per-thread GEMM buffers are made when a backend warms the pool: faer's keeps
/// one per thread sized from the cache it detects (hundreds of MiB where a guest reports a large
/// L3), made on the thread's first product, which would otherwise land inside some step.
fn every_pool_thread_has_its_gemm_buffers_once_warmed() {
    // At the CPU's own level, in a pool of its own: threads that have run no product yet,
    // whatever ran before in this process.
    let _level = Capped::at(kernels::cpu::detected());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(kernels::warm_threads);
    let (m, k, n) = (48, 64, 80);
    let (a, b) = (vec![0.5f32; m * k], vec![0.25f32; n * k]);
    let (_, _, largest) = count_allocations(|| {
        pool.broadcast(|_| {
            // out (m, n) = a (m, k) · bᵀ, b (n, k): small enough to run on this thread alone.
            let mut c = vec![0.0f32; m * n];
            kernels::matmul::forward(&mut c, &a, &b, None, (m, k, n));
            assert_eq!(c[0], 0.5 * 0.25 * k as f32);
        });
    });
    assert!(
        largest <= (4 * m * n) as u64,
        "a {largest}-byte allocation in a first product"
    );
}
