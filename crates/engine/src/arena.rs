//! The arena: one slab per device, carved at start-up into the plan's buffers, with byte-exact
//! accounting of what is live per category and the running peak.
//!
//! Offsets come from `plan::frugal::layout` (buffers whose lifetimes overlap never share bytes),
//! so nothing is allocated inside a step. Entering a phase makes the buffers born in it live;
//! leaving it frees those that die in it. Touching a buffer that is not live is a programmer error
//! and panics: the plan's lifetimes are enforced, not just reported. Views are borrowed through
//! guards with RefCell-style flags, so two live buffers (disjoint bytes) can be borrowed mutably
//! at once while a buffer borrowed twice mutably panics.
//!
//! What it does not do: decide sizes (the plan does) or know what the bytes mean (the models do).
//!
//! Example: `arena.enter(Phase::Forward(0)); let mut qkv = arena.f32_mut(ids.qkv); ...;
//! arena.leave(Phase::Forward(0));` then `arena.measured()` holds the per-category peaks.

use crate::error::EngineError;
use plan::buffer::{Category, Device, Lifetime, MemoryPlan, Phase};
use plan::frugal::assign_offsets;
use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

/// Index of a buffer in its arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(usize);

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

struct Slot {
    name: String,
    category: Category,
    /// Offset and length in f32 elements.
    offset: usize,
    len: usize,
    bytes: u64,
    born: u32,
    dies: u32,
    live: Cell<bool>,
    /// 0 free, > 0 shared borrows, -1 borrowed mutably.
    borrow: Cell<i32>,
}

/// One device's slab and its live-buffer bookkeeping.
pub struct Arena {
    device: Device,
    n_layers: u32,
    slab: UnsafeCell<Vec<f32>>,
    slots: Vec<Slot>,
    by_name: HashMap<String, BufId>,
    live_bytes: [u64; 6],
    measured: Measured,
}

impl Arena {
    /// Carves the slab for `device` from `plan`; refuses before allocating when the slab would
    /// exceed `capacity_bytes`.
    pub fn new(
        plan: &MemoryPlan,
        device: Device,
        capacity_bytes: Option<u64>,
    ) -> Result<Arena, EngineError> {
        let layout = assign_offsets(plan, device);
        if let Some(capacity) = capacity_bytes {
            let needed = layout.slab_bytes.max(plan.peak_bytes(device));
            if needed > capacity {
                return Err(EngineError::DoesNotFit {
                    needed_bytes: needed,
                    capacity_bytes: capacity,
                    category_peak_bytes: plan.category_peaks(device),
                    advice: None,
                });
            }
        }
        let mut slots = Vec::with_capacity(layout.offsets.len());
        let mut by_name = HashMap::new();
        for &(index, offset) in &layout.offsets {
            let b = &plan.buffers[index];
            let (born, dies) = match b.lifetime {
                Lifetime::Persistent => (0, u32::MAX),
                Lifetime::Span { born, dies } => {
                    (born.ordinal(plan.n_layers), dies.ordinal(plan.n_layers))
                }
            };
            by_name.insert(b.name.clone(), BufId(slots.len()));
            slots.push(Slot {
                name: b.name.clone(),
                category: b.category,
                offset: (offset / 4) as usize,
                len: b.bytes.div_ceil(4) as usize,
                bytes: b.bytes,
                born,
                dies,
                live: Cell::new(false),
                borrow: Cell::new(0),
            });
        }
        let slab = vec![0.0f32; (layout.slab_bytes / 4) as usize];
        let mut arena = Arena {
            device,
            n_layers: plan.n_layers,
            slab: UnsafeCell::new(slab),
            slots,
            by_name,
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

    /// The buffer called `name`; panics when the plan has none (the engine and plan disagree).
    pub fn id(&self, name: &str) -> BufId {
        *self
            .by_name
            .get(name)
            .unwrap_or_else(|| panic!("the plan has no buffer {name:?} on {:?}", self.device))
    }

    /// The buffer called `name`, when the plan holds one.
    pub fn try_id(&self, name: &str) -> Option<BufId> {
        self.by_name.get(name).copied()
    }

    fn make_live(&mut self, slots: &[usize]) {
        for &i in slots {
            let s = &self.slots[i];
            assert!(!s.live.get(), "buffer {} born twice", s.name);
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
            assert_eq!(s.borrow.get(), 0, "buffer {} freed while borrowed", s.name);
            if s.live.replace(false) {
                self.live_bytes[s.category as usize] -= s.bytes;
            }
        }
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

    fn check_live(&self, id: BufId) -> &Slot {
        let s = &self.slots[id.0];
        assert!(
            s.live.get(),
            "buffer {} used outside its planned lifetime",
            s.name
        );
        s
    }

    fn raw(&self, s: &Slot) -> *mut f32 {
        // SAFETY: the slab is never resized after construction, so the pointer stays valid for
        // the arena's life; `offset + len` is within the slab by construction of the layout.
        unsafe { (*self.slab.get()).as_mut_ptr().add(s.offset) }
    }

    /// A shared view of a live f32 buffer.
    pub fn f32(&self, id: BufId) -> View<'_, f32> {
        let s = self.check_live(id);
        let b = s.borrow.get();
        assert!(b >= 0, "buffer {} already borrowed mutably", s.name);
        s.borrow.set(b + 1);
        // SAFETY: live buffers with overlapping lifetimes have disjoint bytes (layout), and the
        // borrow flag forbids a mutable view of this buffer while this one exists.
        let data = unsafe { std::slice::from_raw_parts(self.raw(s), s.len) };
        View {
            data,
            flag: &s.borrow,
        }
    }

    /// A mutable view of a live f32 buffer.
    pub fn f32_mut(&self, id: BufId) -> ViewMut<'_, f32> {
        let s = self.check_live(id);
        assert_eq!(s.borrow.get(), 0, "buffer {} already borrowed", s.name);
        s.borrow.set(-1);
        // SAFETY: as in `f32`; the flag makes this the only view of the buffer.
        let data = unsafe { std::slice::from_raw_parts_mut(self.raw(s), s.len) };
        ViewMut {
            data,
            flag: &s.borrow,
        }
    }

    /// A shared view of a live 2-byte buffer (bf16 weights and gradients): `bytes / 2`
    /// elements, not the slot's 4-byte-rounded length.
    pub fn bf16(&self, id: BufId) -> View<'_, half::bf16> {
        let v = self.f32(id);
        let len = (self.slots[id.0].bytes / 2) as usize;
        // SAFETY: bf16 is a repr(transparent) u16 (alignment 2 <= 4), every bit pattern is
        // valid, and `len` 2-byte elements lie within the slot's bytes.
        let data = unsafe { std::slice::from_raw_parts(v.data.as_ptr() as *const half::bf16, len) };
        let flag = v.flag;
        std::mem::forget(v);
        View { data, flag }
    }

    /// A mutable view of a live 2-byte bf16 buffer.
    pub fn bf16_mut(&self, id: BufId) -> ViewMut<'_, half::bf16> {
        let mut v = self.f32_mut(id);
        let len = (self.slots[id.0].bytes / 2) as usize;
        // SAFETY: as in `bf16`.
        let data =
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut half::bf16, len) };
        let flag = v.flag;
        std::mem::forget(v);
        ViewMut { data, flag }
    }

    /// A shared view of a live 2-byte fp16 buffer.
    pub fn f16(&self, id: BufId) -> View<'_, half::f16> {
        let v = self.bf16(id);
        // SAFETY: f16 and bf16 are both repr(transparent) u16 with every bit pattern valid.
        let data =
            unsafe { std::slice::from_raw_parts(v.data.as_ptr() as *const half::f16, v.len()) };
        let flag = v.flag;
        std::mem::forget(v);
        View { data, flag }
    }

    /// A mutable view of a live 2-byte fp16 buffer.
    pub fn f16_mut(&self, id: BufId) -> ViewMut<'_, half::f16> {
        let mut v = self.bf16_mut(id);
        let len = v.len();
        // SAFETY: as in `f16`.
        let data = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut half::f16, len) };
        let flag = v.flag;
        std::mem::forget(v);
        ViewMut { data, flag }
    }

    /// A shared view of a live u32 buffer (token ids share the f32 slab: same size and alignment).
    pub fn u32(&self, id: BufId) -> View<'_, u32> {
        let v = self.f32(id);
        // SAFETY: u32 and f32 have the same size and alignment, and every bit pattern is valid.
        let data = unsafe { std::slice::from_raw_parts(v.data.as_ptr() as *const u32, v.len()) };
        let flag = v.flag;
        std::mem::forget(v);
        View { data, flag }
    }

    /// A mutable view of a live u32 buffer.
    pub fn u32_mut(&self, id: BufId) -> ViewMut<'_, u32> {
        let mut v = self.f32_mut(id);
        let len = v.len();
        // SAFETY: as in `u32`.
        let data = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u32, len) };
        let flag = v.flag;
        std::mem::forget(v);
        ViewMut { data, flag }
    }
}

/// A shared borrow of one buffer; released on drop.
pub struct View<'a, T> {
    data: &'a [T],
    flag: &'a Cell<i32>,
}

impl<T> Deref for View<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> Drop for View<'_, T> {
    fn drop(&mut self) {
        self.flag.set(self.flag.get() - 1);
    }
}

/// A mutable borrow of one buffer; released on drop.
pub struct ViewMut<'a, T> {
    data: &'a mut [T],
    flag: &'a Cell<i32>,
}

impl<T> Deref for ViewMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> DerefMut for ViewMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T> Drop for ViewMut<'_, T> {
    fn drop(&mut self) {
        self.flag.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::buffer::Buffer;

    fn plan() -> MemoryPlan {
        let mut plan = MemoryPlan::new(1);
        let buf = |name: &str, lifetime| Buffer {
            name: name.into(),
            category: Category::Activations,
            device: Device::Gpu,
            bytes: 16,
            lifetime,
        };
        plan.push(buf("w", Lifetime::Persistent));
        let span = Lifetime::Span {
            born: Phase::Forward(0),
            dies: Phase::Backward(0),
        };
        plan.push(buf("a", span));
        plan
    }

    #[test]
    #[should_panic(expected = "used outside its planned lifetime")]
    fn a_buffer_used_before_it_is_born_panics() {
        let arena = Arena::new(&plan(), Device::Gpu, None).unwrap();
        let _ = arena.f32(arena.id("a"));
    }

    #[test]
    #[should_panic(expected = "already borrowed")]
    fn a_buffer_borrowed_twice_mutably_panics() {
        let arena = Arena::new(&plan(), Device::Gpu, None).unwrap();
        let id = arena.id("w");
        let _a = arena.f32_mut(id);
        let _b = arena.f32_mut(id);
    }

    #[test]
    fn live_bytes_follow_the_phases() {
        let mut arena = Arena::new(&plan(), Device::Gpu, None).unwrap();
        let act = Category::Activations as usize;
        assert_eq!(arena.live_bytes()[act], 16);
        arena.enter(Phase::Forward(0));
        assert_eq!(arena.live_bytes()[act], 32);
        arena.f32_mut(arena.id("a")).fill(1.0);
        arena.leave(Phase::Forward(0));
        arena.enter(Phase::Backward(0));
        arena.leave(Phase::Backward(0));
        assert_eq!(arena.live_bytes()[act], 16);
        assert_eq!(arena.measured().peak_bytes, 32);
    }
}
