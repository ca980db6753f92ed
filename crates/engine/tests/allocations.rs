//! "Nothing is allocated inside a step", checked: a counting global allocator records every heap
//! allocation made while `Trainer::step` runs (after a warm-up step), and a step of every
//! precision, ZeRO stage and recompute policy must allocate no tensor-sized block.
//!
//! The arena holds every tensor, so the only heap traffic left in a step is the thread pool's
//! bookkeeping (rayon's job queues grow in blocks of about 1.5 KiB as jobs are pushed: measured
//! 12-19 allocations of at most 1,520 bytes per step here); the test bounds that by size rather
//! than pretending it is zero: no single allocation as large as the smallest activation the
//! step's plan holds (4 KiB at 32 × 32 tokens), and under 64 KiB in all per step.

use engine::testkit::{config, gpt2_tiny, llama_tiny, tokens};
use engine::train::Mixed;
use engine::{TrainConfig, Trainer};
use plan::buffer::{Category, Lifetime};
use plan::setup::{Attention, Recompute, ZeroStage};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
            LARGEST.fetch_max(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations (count, bytes, largest) of `steps` steps after two warm-up steps, and the
/// smallest activation the plan makes live during a step.
fn measure(cfg: TrainConfig, steps: usize) -> (u64, u64, u64, u64) {
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
    COUNT.store(0, Ordering::SeqCst);
    BYTES.store(0, Ordering::SeqCst);
    LARGEST.store(0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    for _ in 0..steps {
        t.step(&mut feed).unwrap();
    }
    ON.store(false, Ordering::SeqCst);
    (
        COUNT.load(Ordering::SeqCst),
        BYTES.load(Ordering::SeqCst),
        LARGEST.load(Ordering::SeqCst),
        smallest,
    )
}

#[test]
fn a_step_allocates_no_tensor() {
    let steps = 4;
    let mut cases = Vec::new();
    for shape in [gpt2_tiny(), llama_tiny()] {
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
    for cfg in cases {
        let what = format!(
            "{} {:?} {:?} {:?} {:?}",
            cfg.model.shape.name, cfg.mixed.precision, cfg.zero, cfg.recompute, cfg.attention
        );
        let (count, bytes, largest, smallest) = measure(cfg, steps);
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
