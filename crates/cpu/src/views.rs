//! Slices of a CPU arena: shared and mutable views of tensors, guarded by the arena's borrow
//! flags (several shared views of a buffer, or one mutable), and `parts_mut` for several
//! disjoint mutable ranges at once (a unit's weight and bias gradients live in one buffer).
//!
//! Example: `let mut qkv = arena.view_mut::<f32>(t); qkv[0] = 1.0;`

use engine::arena::{Arena, BufId};
use engine::backend::{DType, Tensor};
use half::{bf16, f16};
use std::cell::Cell;
use std::ops::{Deref, DerefMut};

use super::Cpu;

/// Element types a CPU view can hold.
pub trait Elem: Copy + 'static {
    const DTYPE: DType;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
}
impl Elem for u32 {
    const DTYPE: DType = DType::U32;
}
impl Elem for u8 {
    const DTYPE: DType = DType::U8;
}
impl Elem for i8 {
    const DTYPE: DType = DType::I8;
}
impl Elem for bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Elem for f16 {
    const DTYPE: DType = DType::F16;
}

/// A shared borrow of one tensor; released on drop.
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

/// A mutable borrow of one tensor; released on drop.
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

/// Mutable borrows of up to `N` disjoint tensors, several of them possibly in one buffer;
/// every buffer is released when this drops.
pub struct PartsMut<'a, T, const N: usize> {
    pub parts: [Option<&'a mut [T]>; N],
    flags: [Option<&'a Cell<i32>>; N],
}

impl<T, const N: usize> Drop for PartsMut<'_, T, N> {
    fn drop(&mut self) {
        self.flags.iter().flatten().for_each(|f| f.set(0));
    }
}

fn ptr<T: Elem>(a: &Arena<Cpu>, t: Tensor) -> (*mut T, &Cell<i32>) {
    assert_eq!(
        t.dtype,
        T::DTYPE,
        "a {:?} tensor viewed as {:?}",
        t.dtype,
        T::DTYPE
    );
    let s = a.checked(t);
    let byte = s.offset_bytes as usize + t.offset * t.dtype.size_bytes();
    // SAFETY: `checked` put the tensor inside its buffer, which lies inside the slab.
    let p = unsafe { a.slab.base().add(byte) as *mut T };
    (p, &s.borrow)
}

/// Slices of a CPU arena's live tensors, borrow-checked at run time (the flags in each slot).
pub trait Views {
    /// A shared view of a live tensor.
    fn view<T: Elem>(&self, t: Tensor) -> View<'_, T>;
    /// A mutable view of a live tensor.
    fn view_mut<T: Elem>(&self, t: Tensor) -> ViewMut<'_, T>;
    /// Mutable views of the given tensors at once: different buffers, or disjoint ranges of one.
    fn parts_mut<T: Elem, const N: usize>(&self, ts: [Option<Tensor>; N]) -> PartsMut<'_, T, N>;
    /// Shared view of the whole buffer `id` as f32.
    fn f32(&self, id: BufId) -> View<'_, f32>;
    /// Mutable view of the whole buffer `id` as f32.
    fn f32_mut(&self, id: BufId) -> ViewMut<'_, f32>;
    /// Shared view of the whole 2-byte buffer `id` as bf16.
    fn bf16(&self, id: BufId) -> View<'_, bf16>;
    /// Shared view of the whole 2-byte buffer `id` as fp16.
    fn f16(&self, id: BufId) -> View<'_, f16>;
    /// Mutable view of the whole 2-byte buffer `id` as fp16.
    fn f16_mut(&self, id: BufId) -> ViewMut<'_, f16>;
    /// Shared view of the whole buffer `id` as token ids.
    fn u32(&self, id: BufId) -> View<'_, u32>;
}

impl Views for Arena<Cpu> {
    /// A shared view of a live tensor.
    fn view<T: Elem>(&self, t: Tensor) -> View<'_, T> {
        let (p, flag) = ptr::<T>(self, t);
        let b = flag.get();
        assert!(
            b >= 0,
            "buffer {} already borrowed mutably",
            self.slots[t.buf.0].key
        );
        flag.set(b + 1);
        // SAFETY: live buffers with overlapping lifetimes have disjoint bytes (layout), the
        // pointer is aligned (4-byte offsets, elements of at most 4 bytes), and the flag forbids
        // a mutable view of this buffer while this one exists.
        let data = unsafe { std::slice::from_raw_parts(p, t.len) };
        View { data, flag }
    }

    /// A mutable view of a live tensor.
    fn view_mut<T: Elem>(&self, t: Tensor) -> ViewMut<'_, T> {
        let (p, flag) = ptr::<T>(self, t);
        let key = self.slots[t.buf.0].key;
        assert_eq!(flag.get(), 0, "buffer {key} already borrowed");
        flag.set(-1);
        // SAFETY: as in `view`; the flag makes this the only view of the buffer.
        let data = unsafe { std::slice::from_raw_parts_mut(p, t.len) };
        ViewMut { data, flag }
    }

    /// Mutable views of the given tensors at once: different buffers, or disjoint ranges of one.
    fn parts_mut<T: Elem, const N: usize>(&self, ts: [Option<Tensor>; N]) -> PartsMut<'_, T, N> {
        let mut flags: [Option<&Cell<i32>>; N] = [None; N];
        for (i, t) in ts.iter().enumerate() {
            let Some(t) = t else { continue };
            for u in ts[..i].iter().flatten().filter(|u| u.buf == t.buf) {
                let apart = t.offset + t.len <= u.offset || u.offset + u.len <= t.offset;
                assert!(apart, "overlapping parts of {}", self.slots[t.buf.0].key);
            }
            if ts[..i].iter().flatten().any(|u| u.buf == t.buf) {
                continue;
            }
            let (_, flag) = ptr::<T>(self, *t);
            let key = self.slots[t.buf.0].key;
            assert_eq!(flag.get(), 0, "buffer {key} already borrowed");
            flag.set(-1);
            flags[i] = Some(flag);
        }
        let parts = ts.map(|t| {
            t.map(|t| {
                let (p, _) = ptr::<T>(self, t);
                // SAFETY: every buffer is flagged mutably borrowed above, and the ranges of
                // one buffer were checked disjoint.
                unsafe { std::slice::from_raw_parts_mut(p, t.len) }
            })
        });
        PartsMut { parts, flags }
    }

    /// Shared view of the whole buffer `id` as f32.
    fn f32(&self, id: BufId) -> View<'_, f32> {
        self.view(self.tensor(id, DType::F32))
    }

    /// Mutable view of the whole buffer `id` as f32.
    fn f32_mut(&self, id: BufId) -> ViewMut<'_, f32> {
        self.view_mut(self.tensor(id, DType::F32))
    }

    /// Shared view of the whole 2-byte buffer `id` as bf16.
    fn bf16(&self, id: BufId) -> View<'_, bf16> {
        self.view(self.tensor(id, DType::Bf16))
    }

    /// Shared view of the whole 2-byte buffer `id` as fp16.
    fn f16(&self, id: BufId) -> View<'_, f16> {
        self.view(self.tensor(id, DType::F16))
    }

    /// Mutable view of the whole 2-byte buffer `id` as fp16.
    fn f16_mut(&self, id: BufId) -> ViewMut<'_, f16> {
        self.view_mut(self.tensor(id, DType::F16))
    }

    /// Shared view of the whole buffer `id` as token ids.
    fn u32(&self, id: BufId) -> View<'_, u32> {
        self.view(self.tensor(id, DType::U32))
    }
}
