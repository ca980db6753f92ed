//! Validation batches: fixed windows of T + 1 tokens starting every T tokens of the validation
//! split, in token order, never shuffled, so every validation loss is measured on the same tokens.
//!
//! Sharded like training: global batch i holds windows `i·N·B .. (i+1)·N·B`, and rank r takes rows
//! `r·B .. (r+1)·B`; the mean over ranks of their mean losses is then the one-rank loss. Windows
//! beyond the last full global batch are left out.
//!
//! ```
//! let tokens: Vec<u32> = (0..1000).map(|i| i % 50).collect();
//! let ds = data::Dataset::new(tokens, 50, 0.2).unwrap();
//! let mut val = ds.val_batches(data::BatchShape::single(2, 16)).unwrap();
//! let (mut x, mut y) = (vec![0u32; 32], vec![0u32; 32]);
//! let mut n = 0;
//! while val.next_batch(&mut x, &mut y) {
//!     n += 1;
//! }
//! assert_eq!(n, val.n_batches());
//! ```

use std::ops::Range;
use std::sync::Arc;

use crate::dataset::BatchShape;
use crate::error::Result;

/// Fixed, in-order (B, T) batches over the validation split.
#[derive(Debug, Clone)]
pub struct ValBatches {
    tokens: Arc<[u32]>,
    range: Range<usize>,
    shape: BatchShape,
    n_batches: usize,
    next: usize,
}

impl ValBatches {
    /// Errors on a zero batch shape, a rank outside the world, an empty validation split, or one
    /// too short for a single global batch.
    pub(crate) fn new(tokens: Arc<[u32]>, range: Range<usize>, shape: BatchShape) -> Result<Self> {
        assert!(
            range.end <= tokens.len(),
            "range {range:?} outside the token stream"
        );
        let n_windows = shape.count_windows("validation", range.len())?;
        Ok(ValBatches {
            tokens,
            range,
            shape,
            n_batches: n_windows / shape.global_rows(),
            next: 0,
        })
    }

    pub fn shape(&self) -> &BatchShape {
        &self.shape
    }

    /// Full global batches in the validation split.
    pub fn n_batches(&self) -> usize {
        self.n_batches
    }

    /// Fills this rank's rows of validation batch `batch_idx` (`< n_batches()`).
    pub fn fill_batch(&self, batch_idx: usize, inputs: &mut [u32], targets: &mut [u32]) {
        assert!(
            batch_idx < self.n_batches,
            "validation batch {batch_idx} of {}",
            self.n_batches
        );
        let shape = self.shape;
        let first_window = batch_idx * shape.global_rows() + shape.rank * shape.batch_size;
        shape.fill_rows(&self.tokens, inputs, targets, |row| {
            self.range.start + (first_window + row) * shape.seq_len
        });
    }

    /// Fills the next batch and returns true, or returns false once all `n_batches()` were given
    /// (then `reset` starts over).
    pub fn next_batch(&mut self, inputs: &mut [u32], targets: &mut [u32]) -> bool {
        if self.next == self.n_batches {
            return false;
        }
        self.fill_batch(self.next, inputs, targets);
        self.next += 1;
        true
    }

    /// Starts again from the first batch.
    pub fn reset(&mut self) {
        self.next = 0;
    }
}
