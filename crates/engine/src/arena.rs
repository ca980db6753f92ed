//! The arena: one slab of a backend's memory per device, carved at start-up into the plan's
//! buffers, with byte-exact accounting of what is live per category and the running peak.
//!
//! Offsets come from `plan_frugal::layout` at the backend's alignment (buffers whose lifetimes
//! overlap never share bytes), so nothing is allocated inside a step. Buffers are found by their
//! typed `plan_frugal::Key`. Entering a phase makes the buffers born in it live; leaving it
//! frees those that die in it. Touching a buffer that is not live is a programmer error and
//! panics: the plan's lifetimes are enforced, not just reported. Tensors ([`Tensor`]) name a
//! buffer, an element type and a range; the CPU backend borrows them as slices through guards
//! with RefCell-style flags (see `backend::cpu`), so two live buffers (disjoint bytes) can be
//! borrowed mutably at once while one buffer borrowed twice mutably panics.
//!
//! What it does not do: decide sizes (the plan does), know what the bytes mean (the models do)
//! or touch them (the backend does).
//!
//! Example: `arena.enter(Phase::Forward(0)); let qkv = arena.tensor(arena.id(key), DType::F32);
//! ...; arena.leave(Phase::Forward(0));` then `arena.measured()` holds the per-category peaks.

use crate::backend::{Backend, DType, Tensor};
use crate::error::EngineError;
use plan::buffer::{Category, Device, Lifetime, MemoryPlan, Phase};
use plan_frugal::{assign_offsets_aligned, Key};
use std::cell::Cell;
use std::collections::HashMap;

/// Index of a buffer in its arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub usize);

/// Peak live bytes per category and in total, as measured while running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Indexed by `Category as usize`, each at its own peak.
    pub category_peak_bytes: [u64; 6],
    /// Live bytes per category at the moment the total first reached `peak_bytes` (the plan's
    /// `at_peak` breakdown, which sums to the peak).
    pub at_peak_bytes: [u64; 6],
    /// The largest sum of live bytes over the run.
    pub peak_bytes: u64,
    /// Bytes the slab reserves.
    pub reserved_bytes: u64,
}

pub struct Slot {
    pub key: Key,
    category: Category,
    /// Offset of the buffer in the slab, in bytes.
    pub offset_bytes: u64,
    pub bytes: u64,
    born: u32,
    dies: u32,
    live: Cell<bool>,
    /// 0 free, > 0 shared borrows, -1 borrowed mutably.
    pub borrow: Cell<i32>,
}

/// One device's slab and its live-buffer bookkeeping.
pub struct Arena<B: Backend> {
    backend: B,
    device: Device,
    n_layers: u32,
    pub slab: B::Slab,
    pub slots: Vec<Slot>,
    by_key: HashMap<Key, BufId>,
    live_bytes: [u64; 6],
    measured: Measured,
}

impl<B: Backend> Arena<B> {
    /// Carves `backend`'s slab for `device` from `plan`; refuses before allocating when the
    /// slab would exceed `capacity_bytes`.
    pub fn new(
        backend: B,
        plan: &MemoryPlan,
        device: Device,
        capacity_bytes: Option<u64>,
    ) -> Result<Arena<B>, EngineError> {
        let layout = assign_offsets_aligned(plan, device, backend.align_bytes());
        if let Some(capacity) = capacity_bytes {
            let needed = layout.slab_bytes.max(plan.peak_bytes(device));
            if needed > capacity {
                let (phase, at_peak) = plan.at_peak(device);
                return Err(EngineError::DoesNotFit(Box::new(crate::capacity::NoFit {
                    limit: crate::capacity::Limit::Device,
                    needed_bytes: needed,
                    capacity_bytes: capacity,
                    ranks: 1,
                    at_peak,
                    phase,
                    layout_bytes: needed - at_peak.iter().sum::<u64>(),
                    host_bytes: 0,
                    advice: None,
                })));
            }
        }
        let mut slots = Vec::with_capacity(layout.offsets.len());
        let mut by_key = HashMap::new();
        for &(index, offset) in &layout.offsets {
            let b = &plan.buffers[index];
            let key = b
                .key
                .unwrap_or_else(|| panic!("buffer {} has no key: not a frugal plan", b.name));
            let (born, dies) = match b.lifetime {
                Lifetime::Persistent => (0, u32::MAX),
                Lifetime::Span { born, dies } => {
                    (born.ordinal(plan.n_layers), dies.ordinal(plan.n_layers))
                }
            };
            by_key.insert(key, BufId(slots.len()));
            slots.push(Slot {
                key,
                category: b.category,
                offset_bytes: offset,
                bytes: b.bytes,
                born,
                dies,
                live: Cell::new(false),
                borrow: Cell::new(0),
            });
        }
        let slab = backend.alloc(layout.slab_bytes)?;
        let mut arena = Arena {
            backend,
            device,
            n_layers: plan.n_layers,
            slab,
            slots,
            by_key,
            live_bytes: [0; 6],
            measured: Measured {
                reserved_bytes: layout.slab_bytes,
                ..Measured::default()
            },
        };
        let persistent: Vec<usize> = (0..arena.slots.len())
            .filter(|&i| arena.slots[i].dies == u32::MAX)
            .collect();
        arena.make_live(&persistent);
        Ok(arena)
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The backend that owns the slab and runs the ops.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The buffer of `key`; panics when the plan has none (the engine and plan disagree).
    pub fn id(&self, key: Key) -> BufId {
        *self
            .by_key
            .get(&key)
            .unwrap_or_else(|| panic!("the plan has no buffer {key} on {:?}", self.device))
    }

    /// The buffer of `key`, when the plan holds one.
    pub fn try_id(&self, key: Key) -> Option<BufId> {
        self.by_key.get(&key).copied()
    }

    /// The whole buffer `id` read as `dtype` (its bytes / the element size, rounded down).
    pub fn tensor(&self, id: BufId, dtype: DType) -> Tensor {
        let len = (self.slots[id.0].bytes / dtype.size_bytes() as u64) as usize;
        Tensor {
            buf: id,
            dtype,
            offset: 0,
            len,
        }
    }

    /// The whole buffer of `key` read as `dtype`.
    pub fn key_tensor(&self, key: Key, dtype: DType) -> Tensor {
        self.tensor(self.id(key), dtype)
    }

    /// The buffer of `key` as `dtype`, or an empty tensor naming no buffer when the plan holds
    /// none: a pipeline stage has no token ids, head or targets where it does not run them,
    /// and none of its ops reads them (a read would index past the slots and panic).
    pub fn held_tensor(&self, key: Key, dtype: DType) -> Tensor {
        self.try_tensor(key, dtype).unwrap_or(Tensor {
            buf: BufId(usize::MAX),
            dtype,
            offset: 0,
            len: 0,
        })
    }

    /// The buffer of `key` as `dtype`, when the plan holds one.
    pub fn try_tensor(&self, key: Key, dtype: DType) -> Option<Tensor> {
        self.try_id(key).map(|id| self.tensor(id, dtype))
    }

    fn make_live(&mut self, slots: &[usize]) {
        for &i in slots {
            let s = &self.slots[i];
            assert!(!s.live.get(), "buffer {} born twice", s.key);
            s.live.set(true);
            self.live_bytes[s.category as usize] += s.bytes;
        }
        let m = &mut self.measured;
        for (peak, live) in m.category_peak_bytes.iter_mut().zip(self.live_bytes) {
            *peak = (*peak).max(live);
        }
        let total: u64 = self.live_bytes.iter().sum();
        if total > m.peak_bytes {
            m.peak_bytes = total;
            m.at_peak_bytes = self.live_bytes;
        }
    }

    /// Makes live every buffer born in `phase`.
    pub fn enter(&mut self, phase: Phase) {
        let ordinal = phase.ordinal(self.n_layers);
        let born: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].born == ordinal && self.slots[i].dies != u32::MAX)
            .collect();
        self.make_live(&born);
    }

    /// Frees every buffer that dies in `phase`.
    pub fn leave(&mut self, phase: Phase) {
        let ordinal = phase.ordinal(self.n_layers);
        for s in self.slots.iter().filter(|s| s.dies == ordinal) {
            assert_eq!(s.borrow.get(), 0, "buffer {} freed while borrowed", s.key);
            if s.live.replace(false) {
                self.live_bytes[s.category as usize] -= s.bytes;
            }
        }
    }

    /// Frees `ids` before their planned end: a pipeline stage parks what one micro-batch's
    /// forward kept (its stash holds the values) so the next forward can use the buffers.
    pub fn park(&mut self, ids: &[BufId]) {
        for id in ids {
            let s = &self.slots[id.0];
            assert_eq!(s.borrow.get(), 0, "buffer {} parked while borrowed", s.key);
            if s.live.replace(false) {
                self.live_bytes[s.category as usize] -= s.bytes;
            }
        }
    }

    /// Makes parked buffers live again, for the backward of the micro-batch they held.
    pub fn revive(&mut self, ids: &[BufId]) {
        let slots: Vec<usize> = ids.iter().map(|id| id.0).collect();
        self.make_live(&slots);
    }

    /// Frees every non-persistent buffer: the end of a forward-only pass (validation, sampling).
    pub fn end_pass(&mut self) {
        for s in self.slots.iter().filter(|s| s.dies != u32::MAX) {
            if s.live.replace(false) {
                self.live_bytes[s.category as usize] -= s.bytes;
            }
        }
    }

    /// Live bytes per category right now.
    pub fn live_bytes(&self) -> [u64; 6] {
        self.live_bytes
    }

    pub fn measured(&self) -> Measured {
        self.measured
    }

    /// The slot of a tensor about to be touched: live, and the tensor inside its bytes.
    pub fn checked(&self, t: Tensor) -> &Slot {
        let s = &self.slots[t.buf.0];
        assert!(
            s.live.get(),
            "buffer {} used outside its planned lifetime",
            s.key
        );
        let end = ((t.offset + t.len) * t.dtype.size_bytes()) as u64;
        assert!(
            end <= s.bytes.next_multiple_of(4),
            "{:?} elements {}..{} lie beyond buffer {} of {} bytes",
            t.dtype,
            t.offset,
            t.offset + t.len,
            s.key,
            s.bytes
        );
        s
    }

    /// Where a live tensor's first element lies in the slab, in bytes: how a backend outside
    /// this crate (CUDA) addresses device memory, with the same lifetime and range checks as a
    /// CPU view.
    pub fn byte_offset(&self, t: Tensor) -> u64 {
        self.checked(t).offset_bytes + (t.offset * t.dtype.size_bytes()) as u64
    }

    /// This arena's device memory.
    pub fn slab(&self) -> &B::Slab {
        &self.slab
    }
}
