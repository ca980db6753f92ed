//! What the CUDA backend (`crates/cuda`) holds on the device besides the arena's slab, so the
//! plan can count it: the cuBLAS workspace (32 MiB, as cuBLAS asks for on Hopper, handed to
//! cuBLAS with `cublasSetWorkspace` so it never allocates its own) and the f64 partials of its
//! reductions, in one allocation; and the driver's 2 MiB granularity.
//!
//! The CUDA context (driver, modules, cuBLAS handle) is not planned from first principles: the
//! backend measures it (`cuMemGetInfo` once the context exists) and reports it apart.
//!
//! Example: `SCRATCH_BYTES` is 33,562,624 bytes.

/// The cuBLAS workspace.
pub const BLAS_WORKSPACE_BYTES: u64 = 32 << 20;
/// Blocks of the backend's grid-stride reductions: one f64 partial each.
pub const REDUCE_BLOCKS: u32 = 1024;
/// The backend's own allocation: the workspace, then the partials.
pub const SCRATCH_BYTES: u64 = BLAS_WORKSPACE_BYTES + REDUCE_BLOCKS as u64 * 8;
/// The driver maps device memory in pages of this size.
pub const DRIVER_PAGE_BYTES: u64 = 2 << 20;

/// Device bytes the driver takes for allocations of `sizes` bytes each (whole pages).
pub fn driver_bytes(sizes: &[u64]) -> u64 {
    sizes
        .iter()
        .map(|&b| b.next_multiple_of(DRIVER_PAGE_BYTES))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_round_up_to_driver_pages() {
        assert_eq!(SCRATCH_BYTES, 33_562_624);
        assert_eq!(driver_bytes(&[SCRATCH_BYTES]), 34 << 20);
        assert_eq!(driver_bytes(&[1, 2 << 20, 0]), 4 << 20);
    }
}
