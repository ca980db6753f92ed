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

use engine::testkit::{config, deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny, tokens};
use engine::train::Mixed;
use engine::{TrainConfig, Trainer};
use kernels::cpu::Level;
use plan::buffer::{Category, Lifetime};
use plan::setup::{Attention, Recompute, ZeroStage};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicU64 = AtomicU64::new(0);
/// The counters are process-wide: tests that read them take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

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

/// The kernels capped at `level` until dropped (then back to the CPU's best).
struct Capped;

impl Capped {
    fn at(level: Level) -> Capped {
        kernels::cpu::set_cap(level).unwrap();
        Capped
    }
}

impl Drop for Capped {
    fn drop(&mut self) {
        kernels::cpu::set_cap(kernels::cpu::detected()).unwrap();
    }
}

/// Allocations (count, bytes, largest) of `steps` steps after two warm-up steps at `level`, and
/// the smallest activation the plan makes live during a step.
fn measure(cfg: TrainConfig, steps: usize, level: Level) -> (u64, u64, u64, u64) {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

/// The inference engine's decode steps, after warm-up: host metadata (positions, cache slots,
/// block-table views, a few dozen bytes a row) and rayon's job queues (blocks of 1,520 bytes),
/// never a block as large as one of the step's tensors (8 rows of q|k|v: 2 KiB).
#[test]
fn a_decode_step_allocates_no_tensor() {
    use engine::infer::Server;
    use plan::frugal::{KvFormat, ServeSetup, WeightFormat};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let shape = llama_tiny();
    let model = engine::ModelConfig::from_shape(shape.clone()).unwrap();
    let formats = [
        WeightFormat::F32,
        WeightFormat::Int8,
        WeightFormat::Int4 {
            group: 32,
            asym: false,
        },
        WeightFormat::Nf4 { group: 32 },
    ];
    for (w, level) in formats
        .iter()
        .flat_map(|&w| kernels::cpu::supported().into_iter().map(move |l| (w, l)))
    {
        let _capped = Capped::at(level);
        let setup = ServeSetup::generation(&shape, 8, 32, w, KvFormat::Int8, 4, 4);
        let mut s = Server::new(model.clone(), setup).unwrap();
        s.fill_random(1);
        // The decode step's q|k|v rows: a tensor of the step (its norm statistics are smaller
        // than a host metadata vector at this toy size).
        let key =
            plan::frugal::Key::Step(plan::frugal::StepKind::Decode, plan::frugal::StepAct::Qkv);
        let smallest = s
            .plan
            .buffers
            .iter()
            .find(|b| b.key == Some(key))
            .unwrap()
            .bytes;
        let seqs: Vec<_> = (0..8).map(|_| s.new_sequence()).collect();
        let mut logits = Vec::new();
        for &q in &seqs {
            s.prefill(q, &tokens(5, 96, 3), &mut logits).unwrap();
        }
        // Warm-up: every rayon thread's kernel scratch grows to the step's sizes (and, where
        // products nest on a thread, to as many as nest).
        for _ in 0..6 {
            s.decode(&seqs, &[1, 2, 3, 4, 5, 6, 7, 8], &mut logits)
                .unwrap();
        }
        COUNT.store(0, Ordering::SeqCst);
        BYTES.store(0, Ordering::SeqCst);
        LARGEST.store(0, Ordering::SeqCst);
        ON.store(true, Ordering::SeqCst);
        for _ in 0..4 {
            s.decode(&seqs, &[9, 10, 11, 12, 13, 14, 15, 16], &mut logits)
                .unwrap();
        }
        ON.store(false, Ordering::SeqCst);
        let largest = LARGEST.load(Ordering::SeqCst);
        assert!(
            largest < smallest,
            "{w:?} at {level}: an allocation of {largest} bytes, the smallest activation is {smallest}"
        );
        assert!(
            BYTES.load(Ordering::SeqCst) < 4 * 64 * 1024,
            "{w:?} at {level}: bytes per 4 steps"
        );
    }
}
