//! A raw pointer that rayon tasks may share, for kernels whose tasks write disjoint strided
//! regions of one buffer (attention heads interleaved within rows), which `chunks_mut` cannot
//! express. Every use states why its writes are disjoint.

#[derive(Clone, Copy)]
pub struct SyncPtr<T>(pub *mut T);

// SAFETY: the pointer is only dereferenced by tasks that write disjoint elements, as argued at
// each use site; the buffer outlives the parallel region because it is borrowed by the caller.
unsafe impl<T: Send> Send for SyncPtr<T> {}
unsafe impl<T: Send> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    pub fn get(self) -> *mut T {
        self.0
    }
}
