//! The inference engine: a model's weights in a storage format, a paged KV cache and the scratch
//! of a prefill and a decode step, all carved from `plan_frugal::serve_plan`, so the measured
//! bytes equal the plan's per category, as in training. Laid out as vLLM lays it out:
//! - the block manager (`blocks`): the one KV-block rule (tables, reference counts,
//!   copy-on-write, sliding-window release), used by the worker and by the plan's replay;
//! - the scheduler (`schedule`): admission, continuous batching, preemption;
//! - the worker ([`Worker`], `step`): weights, caches, prefill and decode steps on one rank;
//!   [`Worker::prefill`] runs up to a chunk of one sequence's tokens per step, [`Worker::decode`]
//!   one token of each of several sequences; [`Worker::fork`] shares a sequence's blocks;
//! - the executor (`executor`): carries out the scheduler's decisions on one worker (`Single`)
//!   or on block counts alone (`Replay`);
//! - tensor parallelism (`tp`): a worker that is one rank of a group holds its share of the
//!   model and meets the others at the embedding, the row-parallel projections and the head.
//!
//! Weights come from fp32 units (a trained model, quantized by `weights`), from random codes built
//! directly in the format (benchmarks: no fp32 copy), or from a quantized file (`file`). `sample`
//! picks tokens, `spec` runs speculative decoding, [`Runner`] runs a model with no cache.
//!
//! Example:
//! ```
//! use infer::Worker;
//! use plan_frugal::{KvFormat, ServeSetup, WeightFormat};
//! let config = engine::ModelConfig::from_shape(engine::testkit::llama_tiny()).unwrap();
//! let w = WeightFormat::Int4 { group: 32, asym: false };
//! let setup = ServeSetup::generation(&config.shape, 1, 32, w, KvFormat::Int8, 16, 1);
//! let mut worker = Worker::new(config, setup).unwrap();
//! worker.fill_random(7);
//! let seq = worker.new_sequence();
//! let mut logits = Vec::new();
//! worker.prefill(seq, &[1, 2, 3], &mut logits).unwrap();
//! worker.decode(&[seq], &[4], &mut logits).unwrap();
//! assert_eq!(worker.seq_len(seq), 4);
//! assert_eq!(worker.measured().peak_bytes, worker.plan.peak_bytes(plan::buffer::Device::Gpu));
//! ```

pub mod blocks;
pub mod executor;
pub mod file;
pub mod group;
mod mla_step;
mod moe_step;
pub mod runner;
pub use engine::sample;
pub mod schedule;
mod ship;
pub mod spec;
mod step;
mod tp;
pub mod weights;

pub use runner::Runner;

use blocks::{BlockManager, SeqId};
use cpu::Cpu;
use engine::arena::{Arena, Measured};
use engine::backend::InferOps;
use engine::backend::{DType, KvCache, QMatrix, Tensor};
use engine::config::ModelConfig;
use engine::error::EngineError;
use plan::buffer::{Device, MemoryPlan};
use plan_frugal::family::{design, BlockDesign};
use plan_frugal::serve::is_matrix;
use plan_frugal::units::{Role, UnitKind};
use plan_frugal::{serve_plan, Key, KvFormat, ServeSetup, StepAct, StepKind, Unit, WeightFormat};

/// The sliding window, in tokens, when every layer has one (blocks before it can be released).
pub fn window_everywhere(config: &ModelConfig) -> Option<usize> {
    let w = config.shape.sliding_window.as_ref()?;
    (w.first_layer == 0).then_some(w.window as usize)
}

/// The steps a prefill of `len` tokens runs: chunks of at most `chunk`, the previous one ended
/// early so that the last `rows` rows (whose logits are kept) fall in the last one.
pub fn prefill_chunks(len: usize, chunk: usize, rows: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < len {
        let end = len.min(start + chunk);
        let end = if end < len && len - end < rows {
            len - rows
        } else {
            end
        };
        out.push(start..end);
        start = end;
    }
    out
}

/// The split-K partials a worker plans by default: one split per thread (`rayon`'s pool).
pub fn default_split_k() -> u64 {
    rayon::current_num_threads().clamp(1, 64) as u64
}

/// How a decode step splits each sequence's KV range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitK {
    /// Enough splits to give every core work when rows × KV heads are few (up to the plan's).
    Auto,
    /// Head-parallel only.
    Off,
    /// Exactly this many splits (at most the plan's).
    Fixed(usize),
}

/// One unit's weights: its matrices in the storage format and its fp32 vectors.
pub(crate) struct UnitWeights {
    pub matrices: Vec<(Role, QMatrix)>,
    pub vectors: Vec<(Role, Tensor)>,
}

impl UnitWeights {
    fn matrix(&self, role: Role) -> QMatrix {
        self.matrices
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, m)| *m)
            .unwrap_or_else(|| panic!("no matrix {role:?}"))
    }

    fn vector(&self, role: Role) -> Option<Tensor> {
        self.vectors
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, t)| *t)
    }
}

/// The worker: one model's weights, KV caches and prefill and decode steps on one rank, on a
/// backend (the CPU by default).
pub struct Worker<B: InferOps = Cpu> {
    pub plan: MemoryPlan,
    pub arena: Arena<B>,
    pub config: ModelConfig,
    pub setup: ServeSetup,
    pub split_k: SplitK,
    pub(crate) design: BlockDesign,
    pub(crate) units: Vec<Unit>,
    pub(crate) weights: Vec<UnitWeights>,
    pub(crate) caches: Vec<KvCache>,
    /// The KV cache's block tables (the one block rule, shared with `schedule::simulate`).
    pub blocks: BlockManager,
    /// Tensor parallelism: this rank's link to its group (`None`: the whole model here).
    pub(crate) tp: Option<tp::TpRank>,
}

impl Worker<Cpu> {
    /// A worker for `config` sized by `setup` on the CPU, weights zeroed.
    pub fn new(config: ModelConfig, setup: ServeSetup) -> Result<Worker, EngineError> {
        Worker::on(Cpu::new(), config, setup, None)
    }

    /// As [`Worker::new`], refused before allocating when the plan exceeds the RAM this process
    /// may use, with the plan's breakdown and what to change.
    pub fn new_in_ram(config: ModelConfig, setup: ServeSetup) -> Result<Worker, EngineError> {
        let host = engine::capacity::host_available();
        let capacity = host.as_ref().map(|h| h.bytes);
        Worker::on(Cpu::new(), config, setup, capacity).map_err(|e| match e {
            EngineError::DoesNotFit(mut no) => {
                no.limit = engine::capacity::Limit::HostRam {
                    source: host.map_or_else(String::new, |h| h.source),
                };
                no.advice = Some(
                    "store the weights smaller (--weights int8, int4 or nf4), cache keys and \
                     values smaller (--kv-dtype bf16, int8 or fp8), or plan fewer sequences or \
                     a shorter context (a shorter prompt and fewer new tokens; for `frugal \
                     serve`, --max-seqs, --kv-tokens and --ctx)"
                        .into(),
                );
                EngineError::DoesNotFit(no)
            }
            e => e,
        })
    }
}

impl<B: InferOps> Worker<B> {
    /// A worker on `backend`; refuses before allocating when the slab exceeds `capacity`.
    pub fn on(
        backend: B,
        config: ModelConfig,
        setup: ServeSetup,
        capacity: Option<u64>,
    ) -> Result<Worker<B>, EngineError> {
        engine::backend::require::<B>(engine::backend::model_needs(&config.shape))?;
        let plan = serve_plan(&config.shape, &setup)?;
        let units = plan_frugal::param_units(&config.shape, 1)?;
        Worker::with_plan(backend, config, setup, capacity, (plan, units))
    }

    /// A worker of `config` (a whole model or a rank's share) holding `units`, carved from
    /// `plan`.
    pub(crate) fn with_plan(
        backend: B,
        config: ModelConfig,
        setup: ServeSetup,
        capacity: Option<u64>,
        (plan, units): (MemoryPlan, Vec<Unit>),
    ) -> Result<Worker<B>, EngineError> {
        let arena = Arena::new(backend, &plan, Device::Gpu, capacity)?;
        let weights = units
            .iter()
            .map(|u| bind_unit(&arena, u, setup.weights))
            .collect();
        let s = &config.shape;
        let caches = (0..s.n_layers)
            .map(|l| bind_cache(&arena, l, &setup, &config))
            .collect();
        Ok(Worker {
            design: design(s),
            blocks: BlockManager::new(
                setup.kv_blocks as usize,
                setup.kv_block as usize,
                window_everywhere(&config),
            ),
            plan,
            arena,
            config,
            setup,
            split_k: SplitK::Auto,
            units,
            weights,
            caches,
            tp: None,
        })
    }

    pub fn measured(&self) -> Measured {
        self.arena.measured()
    }

    /// A new, empty sequence.
    pub fn new_sequence(&mut self) -> SeqId {
        self.blocks.new_sequence()
    }

    /// Tokens cached for `id`.
    pub fn seq_len(&self, id: SeqId) -> usize {
        self.blocks.seq(id).len
    }

    /// A new sequence sharing `id`'s cached tokens (its blocks, copied on write).
    pub fn fork(&mut self, id: SeqId) -> SeqId {
        self.blocks.fork(id)
    }

    /// Frees `id` and the blocks no other sequence shares.
    pub fn free(&mut self, id: SeqId) {
        self.blocks.free(id)
    }

    /// Keeps the first `len` tokens of `id` (speculative decoding's rollback).
    pub fn truncate(&mut self, id: SeqId, len: usize) {
        self.blocks.truncate(id, len)
    }

    /// Blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.blocks.free_blocks()
    }

    /// Blocks `id` needs to grow by `n` tokens (new blocks, and a copy of a shared last block).
    pub fn blocks_needed(&self, id: SeqId, n: usize) -> usize {
        self.blocks.blocks_needed(id, n)
    }

    /// Bytes of KV one block holds over every layer.
    pub fn block_bytes(&self) -> u64 {
        self.setup.block_bytes(&self.config.shape)
    }

    /// Runs `tokens` of `id` through the model in prefill steps, appending them to its cache;
    /// `logits` receives the last step's final `setup.prefill_logit_rows` rows (or fewer).
    pub fn prefill(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.prefill_rows(id, tokens, 1, logits)
    }

    /// As [`Worker::prefill`], returning the logits of the last `rows` tokens (speculative
    /// verification), `rows` at most the plan's `prefill_logit_rows`.
    pub fn prefill_rows(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        rows: usize,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Infer(
                "a prefill needs at least one token".into(),
            ));
        }
        let chunk = self.setup.prefill_chunk as usize;
        assert!(rows as u64 <= self.setup.prefill_logit_rows && rows <= tokens.len());
        self.check_room(&[id], tokens.len())?;
        self.check_tokens(tokens.iter().copied())?;
        for range in prefill_chunks(tokens.len(), chunk, rows) {
            let want = if range.end == tokens.len() {
                rows.min(range.len())
            } else {
                0
            };
            self.step(StepKind::Prefill, &[(id, &tokens[range])], want, logits)?;
        }
        Ok(())
    }

    /// One decode step: token `tokens[i]` appended to sequence `ids[i]`; `logits` receives one
    /// row per sequence.
    pub fn decode(
        &mut self,
        ids: &[SeqId],
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        assert_eq!(ids.len(), tokens.len());
        if ids.len() as u64 > self.setup.max_seqs {
            return Err(EngineError::Infer(format!(
                "{} sequences in one decode step; the engine was planned for {}",
                ids.len(),
                self.setup.max_seqs
            )));
        }
        self.check_room(ids, 1)?;
        let entries: Vec<(SeqId, &[u32])> = ids
            .iter()
            .zip(tokens)
            .map(|(&id, t)| (id, std::slice::from_ref(t)))
            .collect();
        self.step(StepKind::Decode, &entries, ids.len(), logits)
    }

    /// Refuses growth past the context or the pool before anything runs.
    fn check_room(&self, ids: &[SeqId], n: usize) -> Result<(), EngineError> {
        let mut need = 0;
        for &id in ids {
            let len = self.seq_len(id) + n;
            if len as u64 > self.setup.context {
                return Err(EngineError::Infer(format!(
                    "a sequence of {len} tokens is longer than the context of {} this engine was \
                     planned for (the model has {} positions): shorten the prompt, generate fewer \
                     tokens or plan a longer context",
                    self.setup.context, self.config.shape.max_positions
                )));
            }
            need += self.blocks_needed(id, n);
        }
        if need > self.blocks.free_blocks() {
            return Err(EngineError::Infer(format!(
                "the KV pool has {} free blocks of {} tokens and this step needs {need}: free \
                 sequences first or plan a larger pool",
                self.blocks.free_blocks(),
                self.setup.kv_block
            )));
        }
        Ok(())
    }
}

/// The tensors of one unit's weights in the arena.
fn bind_unit<B: InferOps>(arena: &Arena<B>, unit: &Unit, format: WeightFormat) -> UnitWeights {
    let mut matrices = Vec::new();
    let mut vectors = Vec::new();
    let mut offset = 0usize;
    let vec_buf = arena.try_tensor(Key::Vectors(unit.kind), DType::F32);
    for v in &unit.views {
        if is_matrix(v.role) {
            let (rows, cols) = (v.shape[0] as usize, v.shape[1] as usize);
            // The matrix's own format: ggml keeps some roles' codes two a byte.
            let format = format.of(v.role);
            let dtype = match format {
                WeightFormat::F32 => DType::F32,
                WeightFormat::Bf16 => DType::Bf16,
                WeightFormat::Ggml { .. } if format.nibbles(v.role) => DType::U8,
                WeightFormat::Int8 | WeightFormat::Ggml { .. } => DType::I8,
                _ => DType::U8,
            };
            let (scale_type, zero_type) = match format {
                WeightFormat::Nf4 { .. } => (DType::F32, DType::U8),
                WeightFormat::Ggml { .. } => (DType::F32, DType::F32),
                _ => (DType::F16, DType::U8),
            };
            matrices.push((
                v.role,
                QMatrix {
                    format,
                    codes: arena.key_tensor(Key::QWeight(unit.kind, v.role), dtype),
                    scales: arena.try_tensor(Key::QScales(unit.kind, v.role), scale_type),
                    zeros: arena.try_tensor(Key::QZeros(unit.kind, v.role), zero_type),
                    rows,
                    cols,
                    row_block: rows,
                },
            ));
        } else {
            let n = v.numel() as usize;
            let t = vec_buf.expect("a vectors buffer").slice(offset..offset + n);
            vectors.push((v.role, t));
            offset += n;
        }
    }
    // A stack of experts' matrices runs an expert's rows at a time: 2·F of gate|up (F, the
    // down projection's columns), C of the down projection (gate|up's columns).
    let cols = |role| {
        matrices
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, m)| m.cols)
    };
    let (fc, proj) = (cols(Role::ExpertsFcWeight), cols(Role::ExpertsProjWeight));
    for (role, m) in &mut matrices {
        match (*role, fc, proj) {
            (Role::ExpertsFcWeight, _, Some(f)) => m.row_block = 2 * f,
            (Role::ExpertsProjWeight, Some(c), _) => m.row_block = c,
            _ => {}
        }
    }
    UnitWeights { matrices, vectors }
}

fn bind_cache<B: InferOps>(
    arena: &Arena<B>,
    layer: u32,
    setup: &ServeSetup,
    config: &ModelConfig,
) -> KvCache {
    let dtype = match setup.kv {
        KvFormat::F32 => DType::F32,
        KvFormat::Bf16 => DType::Bf16,
        KvFormat::Int8 => DType::I8,
        KvFormat::Fp8 => DType::U8,
    };
    let s = &config.shape;
    let k = arena.key_tensor(Key::KvK(layer), dtype);
    KvCache {
        format: setup.kv,
        k,
        // Latent attention caches one latent row per token (in `k`): no values.
        v: arena.try_tensor(Key::KvV(layer), dtype).unwrap_or(k),
        k_scales: arena.try_tensor(Key::KvKScales(layer), DType::F32),
        v_scales: arena.try_tensor(Key::KvVScales(layer), DType::F32),
        n_heads: s.n_heads as usize,
        // A latent row per token: one "head" of latent + RoPE key.
        n_kv_heads: s.mla.as_ref().map_or(s.n_kv_heads as usize, |_| 1),
        head_dim: s
            .mla
            .as_ref()
            .map_or(s.d_head, |m| m.kv_lora_rank + m.qk_rope_head_dim) as usize,
        block: setup.kv_block as usize,
    }
}

/// The step tensor `t` of `kind` (f32 unless token ids).
pub(crate) fn step_tensor<B: InferOps>(
    arena: &Arena<B>,
    kind: StepKind,
    t: StepAct,
) -> Option<Tensor> {
    let dtype = if matches!(t, StepAct::Tokens | StepAct::Route) {
        DType::U32
    } else {
        DType::F32
    };
    arena.try_tensor(Key::Step(kind, t), dtype)
}

/// The unit of `kind`'s index in `units`.
pub(crate) fn unit_index(units: &[Unit], kind: UnitKind) -> usize {
    units
        .iter()
        .position(|u| u.kind == kind)
        .expect("a unit of that kind")
}

#[cfg(test)]
mod ship_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tp_tests;
#[cfg(test)]
mod window_tests;
