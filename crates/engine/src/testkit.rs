//! What the tests and benches of every crate share instead of copies: toy model shapes, seeded
//! tokens and values, and loud comparisons. Public so integration tests, benches and the CLI's
//! tests reach it; nothing in the engine itself uses it. The training harness (run configs, ranks,
//! snapshots) is `train::testkit`.

use plan::model::Family;
use plan::ModelShape;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A GPT-2 block design at toy size (the golden files use the same shape).
pub fn gpt2_tiny() -> ModelShape {
    ModelShape {
        name: "gpt2-test".into(),
        family: Family::Gpt2,
        n_layers: 2,
        d_model: 32,
        n_heads: 4,
        n_kv_heads: 4,
        d_head: 8,
        d_ff: 128,
        vocab: 96,
        max_positions: 32,
        tied_embeddings: true,
        moe: None,
        mla: None,
        sliding_window: None,
    }
}

/// A Llama block design at toy size: GQA (4 query heads over 2 kv heads), untied head.
pub fn llama_tiny() -> ModelShape {
    ModelShape {
        name: "llama-test".into(),
        family: Family::Llama,
        n_kv_heads: 2,
        d_ff: 64,
        tied_embeddings: false,
        ..gpt2_tiny()
    }
}

/// A Mixtral block design at toy size: Llama attention and 4 SwiGLU experts of 48, top 2,
/// trained with the preset's load-balancing loss.
pub fn mixtral_tiny() -> ModelShape {
    ModelShape {
        name: "mixtral-test".into(),
        family: Family::Mixtral,
        d_ff: 48,
        moe: Some(plan::model::Moe {
            n_experts: 4,
            n_active: 2,
            n_shared: 0,
            d_ff_expert: 48,
            first_dense: 0,
            router_bias: false,
        }),
        ..llama_tiny()
    }
}

/// DeepSeek-V2's design at toy size: latent attention with a query bottleneck (4 heads of
/// 8 + 4, values 8), a dense first layer, then 4 routed experts of 16 (top 2) and 2 shared ones.
pub fn deepseek_tiny() -> ModelShape {
    ModelShape {
        name: "deepseek-test".into(),
        family: Family::Deepseek,
        n_layers: 3,
        d_head: 8,
        d_ff: 64,
        moe: Some(plan::model::Moe {
            n_experts: 4,
            n_active: 2,
            n_shared: 2,
            d_ff_expert: 16,
            first_dense: 1,
            router_bias: false,
        }),
        mla: Some(plan::model::Mla {
            q_lora_rank: Some(24),
            kv_lora_rank: 16,
            qk_rope_head_dim: 4,
            qk_nope_head_dim: 8,
            v_head_dim: 8,
        }),
        ..llama_tiny()
    }
}

/// Deterministic pseudo-random tokens below `vocab`.
pub fn tokens(n: usize, vocab: u64, seed: u64) -> Vec<u32> {
    let mut rng = data::SplitMix64::new(seed);
    (0..n).map(|_| rng.next_below(vocab) as u32).collect()
}

/// `n` values uniform in [-scale/2, scale/2) from `seed` (the project's SplitMix64).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = data::SplitMix64::new(seed);
    let unit = |x: u64| (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    (0..n).map(|_| scale * unit(rng.next_u64())).collect()
}

/// The largest absolute difference between two lists of equal-length vectors.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "as many vectors");
    let pairs = a.iter().zip(b).flat_map(|(p, q)| {
        assert_eq!(p.len(), q.len(), "vectors of equal length");
        p.iter().zip(q)
    });
    pairs.map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Fails with `what`, the index and both values unless `|got - want| <= tol · max(1, |want|)`.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: got {g}, want {w} (tolerance {tol}, relative above 1)"
        );
    }
}

/// The f32 tensor `name` of safetensors `bytes` (golden files; int32 inputs read as bits).
pub fn safetensors_f32s(bytes: &[u8], name: &str) -> Vec<f32> {
    let st = safetensors::SafeTensors::deserialize(bytes).expect("a safetensors file");
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("golden file lacks {name}"));
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Fails naming `name`, the index and both values unless every `|got - want| <= tol`
/// (absolute: golden tensors of O(1) values).
pub fn assert_max_abs(name: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let (mut max_err, mut at) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        if err > max_err || err.is_nan() {
            (max_err, at) = (err, i);
        }
    }
    assert!(
        max_err <= tol,
        "{name}: max error {max_err:e} at {at} (got {}, want {}), tolerance {tol:e}",
        got[at],
        want[at]
    );
}

/// A global allocator that counts while [`count_allocations`] runs: a test binary installs it
/// with `#[global_allocator] static A: Counting = Counting;` to check that a step allocates no
/// tensor-sized block.
pub struct Counting;

static COUNTING_ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicU64 = AtomicU64::new(0);
/// The counters are process-wide: measurements take turns.
static SERIAL: Mutex<()> = Mutex::new(());

// SAFETY: every call is forwarded unchanged to the system allocator; counting only reads sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING_ON.load(Ordering::Relaxed) {
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

/// Heap allocations made while `f` runs, as (count, bytes, largest), with [`Counting`] installed
/// (zeros otherwise). One measurement at a time in the process, and it counts every thread's
/// allocations, not only `f`'s: a test that measures must not run beside another test.
pub fn count_allocations(f: impl FnOnce()) -> (u64, u64, u64) {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    COUNT.store(0, Ordering::SeqCst);
    BYTES.store(0, Ordering::SeqCst);
    LARGEST.store(0, Ordering::SeqCst);
    COUNTING_ON.store(true, Ordering::SeqCst);
    f();
    COUNTING_ON.store(false, Ordering::SeqCst);
    let load = |c: &AtomicU64| c.load(Ordering::SeqCst);
    (load(&COUNT), load(&BYTES), load(&LARGEST))
}

/// The kernels capped at `level` until dropped (then back to the CPU's best); tests that cap take
/// turns.
pub struct Capped {
    _turn: MutexGuard<'static, ()>,
}

static CAPS: Mutex<()> = Mutex::new(());

impl Capped {
    pub fn at(level: kernels::cpu::Level) -> Capped {
        let turn = CAPS.lock().unwrap_or_else(|e| e.into_inner());
        kernels::cpu::set_cap(level).unwrap();
        Capped { _turn: turn }
    }
}

impl Drop for Capped {
    fn drop(&mut self) {
        kernels::cpu::set_cap(kernels::cpu::detected()).unwrap();
    }
}

/// The golden files' folder: models, inputs and outputs written by PyTorch + HF (`dev/golden_*.py`).
pub const GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");

/// A golden file: safetensors holding the tensors, with the model's HF config, batch and seq in
/// its JSON header.
pub struct Golden {
    pub bytes: Vec<u8>,
    pub meta: HashMap<String, String>,
}

impl Golden {
    /// Reads `name` from [`GOLDEN_DIR`]; panics naming the file if it is missing or not golden.
    pub fn load(name: &str) -> Golden {
        let path = format!("{GOLDEN_DIR}/{name}");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (_, metadata) =
            safetensors::SafeTensors::read_metadata(&bytes).expect("golden file is safetensors");
        let meta = metadata
            .metadata()
            .clone()
            .expect("golden file has a JSON header");
        assert_eq!(meta["magic"], "frugal-golden", "{path}: wrong magic");
        assert_eq!(meta["version"], "1", "{path}: unknown version");
        Golden { bytes, meta }
    }

    /// The f32 tensor `name`.
    pub fn f32s(&self, name: &str) -> Vec<f32> {
        safetensors_f32s(&self.bytes, name)
    }

    /// The int32 tensor `name` (token ids), stored as f32 bits.
    pub fn u32s(&self, name: &str) -> Vec<u32> {
        self.f32s(name).iter().map(|x| x.to_bits()).collect()
    }
}
