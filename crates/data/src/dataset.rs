//! A token stream split into training and validation parts, and the shapes batches are cut in.
//!
//! Validation is the *last* `val_fraction` of the tokens (rounded up), held out: training windows
//! are cut only from the first part, validation windows only from the last, so no token seen in
//! validation is ever trained on. The batch cutters live in `loader.rs` (training, shuffled) and
//! `validation.rs` (fixed windows).
//!
//! ```
//! let tokens: Vec<u32> = (0..1000).map(|i| i % 50).collect();
//! let ds = data::Dataset::new(tokens, 50, data::DEFAULT_VAL_FRACTION).unwrap();
//! assert_eq!((ds.train_tokens().len(), ds.val_tokens().len()), (900, 100));
//! ```

use std::ops::Range;
use std::sync::Arc;

use crate::error::{DataError, Result};
use crate::loader::{Loader, LoaderConfig};
use crate::token_file::check_tokens;
use crate::validation::ValBatches;

/// The share of tokens held out for validation unless the caller says otherwise.
pub const DEFAULT_VAL_FRACTION: f64 = 0.1;

/// How batches are cut: `batch_size` rows of `seq_len` tokens per rank, `world_size` data-parallel
/// ranks, this one being `rank`. A global batch has `world_size * batch_size` rows; rank r takes
/// rows `r * batch_size .. (r + 1) * batch_size`, so N ranks of B rows see exactly the rows one rank
/// of N × B rows would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchShape {
    pub batch_size: usize,
    pub seq_len: usize,
    pub rank: usize,
    pub world_size: usize,
}

impl BatchShape {
    /// One rank of one.
    pub fn single(batch_size: usize, seq_len: usize) -> Self {
        BatchShape {
            batch_size,
            seq_len,
            rank: 0,
            world_size: 1,
        }
    }

    /// Tokens in one rank's `inputs` (and `targets`) buffer: `batch_size * seq_len`.
    pub fn tokens_per_batch(&self) -> usize {
        self.batch_size * self.seq_len
    }

    /// Rows of one global batch (all ranks).
    pub fn global_rows(&self) -> usize {
        self.batch_size * self.world_size
    }

    /// Fills this rank's `inputs` and `targets` (each `batch_size × seq_len`, row-major (B, T))
    /// from `tokens`: row r is the `seq_len` tokens from `tokens[start(r)]` on, its targets the
    /// same window one token later.
    pub(crate) fn fill_rows(
        &self,
        tokens: &[u32],
        inputs: &mut [u32],
        targets: &mut [u32],
        start: impl Fn(usize) -> usize,
    ) {
        let n = self.tokens_per_batch();
        assert_eq!(
            inputs.len(),
            n,
            "inputs must hold batch_size * seq_len tokens"
        );
        assert_eq!(
            targets.len(),
            n,
            "targets must hold batch_size * seq_len tokens"
        );
        let t = self.seq_len;
        for row in 0..self.batch_size {
            let start = start(row);
            inputs[row * t..(row + 1) * t].copy_from_slice(&tokens[start..start + t]);
            targets[row * t..(row + 1) * t].copy_from_slice(&tokens[start + 1..start + t + 1]);
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.seq_len == 0 {
            return Err(DataError::ZeroShape {
                batch_size: self.batch_size,
                seq_len: self.seq_len,
            });
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(DataError::BadRank {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        Ok(())
    }

    /// Windows of `seq_len + 1` tokens starting every `seq_len` tokens in a split of `n_tokens`, and
    /// an error if there are fewer than one global batch of them.
    pub(crate) fn count_windows(&self, split: &'static str, n_tokens: usize) -> Result<usize> {
        self.validate()?;
        if n_tokens == 0 {
            return Err(DataError::EmptyDataset { split });
        }
        let n_windows = (n_tokens - 1) / self.seq_len;
        if n_windows < self.global_rows() {
            return Err(DataError::TooShort {
                split,
                needed_tokens: (self.global_rows() * self.seq_len + 1) as u64,
                have_tokens: n_tokens as u64,
                batch_size: self.batch_size,
                seq_len: self.seq_len,
                world_size: self.world_size,
            });
        }
        Ok(n_windows)
    }
}

/// A validated token stream (every id below the vocabulary) with its train/validation split.
#[derive(Debug, Clone)]
pub struct Dataset {
    tokens: Arc<[u32]>,
    vocab_size: u32,
    /// Index of the first validation token.
    split_at: usize,
}

impl Dataset {
    /// Checks the tokens (non-empty, each `< vocab_size`) and holds out the last
    /// `ceil(len * val_fraction)` of them for validation. `val_fraction` must be in `[0, 1)`; 0
    /// means no validation split. Errors if the training part would be empty.
    pub fn new(tokens: Vec<u32>, vocab_size: u32, val_fraction: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(DataError::BadValFraction { val_fraction });
        }
        if tokens.is_empty() {
            return Err(DataError::EmptyDataset { split: "whole" });
        }
        check_tokens(None, vocab_size, &tokens)?;
        let n_val = (tokens.len() as f64 * val_fraction).ceil() as usize;
        let split_at = tokens.len() - n_val.min(tokens.len());
        if split_at == 0 {
            return Err(DataError::NothingToTrain {
                total: tokens.len(),
                held_out: n_val,
            });
        }
        Ok(Dataset {
            tokens: tokens.into(),
            vocab_size,
            split_at,
        })
    }

    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The data's identity: a 64-bit FNV-1a hash of every token and the count (snapshots record
    /// it so a resume refuses other data).
    pub fn id(&self) -> u64 {
        // FNV-1a over every token's bytes, then the count: stable across runs and platforms.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for t in self.tokens.iter().flat_map(|t| t.to_le_bytes()) {
            h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
        }
        h ^ self.tokens.len() as u64
    }

    /// All tokens, training then validation.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn train_range(&self) -> Range<usize> {
        0..self.split_at
    }

    pub fn val_range(&self) -> Range<usize> {
        self.split_at..self.tokens.len()
    }

    pub fn train_tokens(&self) -> &[u32] {
        &self.tokens[self.train_range()]
    }

    pub fn val_tokens(&self) -> &[u32] {
        &self.tokens[self.val_range()]
    }

    /// A shuffling loader over the training split.
    pub fn train_loader(&self, config: LoaderConfig) -> Result<Loader> {
        Loader::new(
            Arc::clone(&self.tokens),
            self.train_range(),
            "train",
            config,
        )
    }

    /// Fixed, in-order batches over the validation split.
    pub fn val_batches(&self, shape: BatchShape) -> Result<ValBatches> {
        ValBatches::new(Arc::clone(&self.tokens), self.val_range(), shape)
    }
}
