//! The training batch loader: (B, T) inputs and their next-token targets, cut from windows of
//! T + 1 tokens that start every T tokens of the training split, visited in a shuffled order that
//! is a pure function of (seed, epoch).
//!
//! Every global batch takes the next `world_size × B` windows of the epoch's order; rank r keeps
//! rows `r·B .. (r+1)·B`. So N ranks of B rows see exactly the rows of one rank of N·B rows, and
//! the position (epoch, batch in epoch) means the same thing on every rank. Windows left over at
//! the end of an epoch (fewer than a global batch) are skipped, so every batch is full. The
//! window order buffer is allocated once, at construction; `next_batch` allocates nothing.
//!
//! ```
//! let tokens: Vec<u32> = (0..1000).map(|i| i % 50).collect();
//! let ds = data::Dataset::new(tokens, 50, 0.1).unwrap();
//! let config = data::LoaderConfig::shuffled(data::BatchShape::single(4, 16), 1234);
//! let mut loader = ds.train_loader(config).unwrap();
//! let (mut x, mut y) = (vec![0u32; 64], vec![0u32; 64]);
//! let here = loader.position();
//! loader.next_batch(&mut x, &mut y);
//! assert_eq!(x[1..16], y[..15]);
//! loader.seek(here).unwrap(); // a resumed loader repeats the same batch
//! ```

use std::ops::Range;
use std::sync::Arc;

use crate::dataset::BatchShape;
use crate::error::{DataError, Result};
use rng::SplitMix64;

/// The order windows are visited in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowOrder {
    /// A fresh Fisher–Yates permutation each epoch from `SplitMix64::for_epoch(seed, epoch)`.
    Shuffled { seed: u64 },
    /// Windows in token order, every epoch the same.
    Sequential,
}

/// How a training loader cuts and orders batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    pub shape: BatchShape,
    pub order: WindowOrder,
}

impl LoaderConfig {
    pub fn shuffled(shape: BatchShape, seed: u64) -> Self {
        LoaderConfig {
            shape,
            order: WindowOrder::Shuffled { seed },
        }
    }
}

/// Where a loader is: the batch `next_batch` will produce next. Save it in a snapshot and `seek`
/// to it to resume exactly. It is the same on every rank, and stays valid when the world size
/// changes as long as the global batch (`world_size × batch_size`) and `seq_len` stay the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoaderPosition {
    pub epoch: u64,
    pub batch_in_epoch: u64,
}

/// Shuffled (B, T) training batches over one split of a token stream.
#[derive(Debug, Clone)]
pub struct Loader {
    tokens: Arc<[u32]>,
    range: Range<usize>,
    config: LoaderConfig,
    n_windows: usize,
    batches_per_epoch: u64,
    position: LoaderPosition,
    /// Window indices in this epoch's order; valid for `order_epoch`.
    order: Vec<u32>,
    order_epoch: Option<u64>,
}

impl Loader {
    /// A loader over `tokens[range]`; `split` names the range in errors. Errors on a zero batch
    /// shape, a rank outside the world, or fewer tokens than one global batch needs.
    pub(crate) fn new(
        tokens: Arc<[u32]>,
        range: Range<usize>,
        split: &'static str,
        config: LoaderConfig,
    ) -> Result<Self> {
        assert!(
            range.end <= tokens.len(),
            "range {range:?} outside the token stream"
        );
        let n_windows = config.shape.count_windows(split, range.len())?;
        assert!(
            u32::try_from(n_windows).is_ok(),
            "more than 2^32 windows; widen Loader::order"
        );
        let batches_per_epoch = (n_windows / config.shape.global_rows()) as u64;
        Ok(Loader {
            tokens,
            range,
            config,
            n_windows,
            batches_per_epoch,
            position: LoaderPosition::default(),
            order: vec![0; n_windows],
            order_epoch: None,
        })
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// Windows of `seq_len + 1` tokens in the split.
    pub fn n_windows(&self) -> usize {
        self.n_windows
    }

    /// Full global batches per epoch (leftover windows are skipped).
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// The batch `next_batch` produces next.
    pub fn position(&self) -> LoaderPosition {
        self.position
    }

    pub fn epoch(&self) -> u64 {
        self.position.epoch
    }

    /// Moves to `position`, so the next batch is the one produced there before. Errors if the batch
    /// is past the end of an epoch (a position from another data set or batch shape).
    pub fn seek(&mut self, position: LoaderPosition) -> Result<()> {
        if position.batch_in_epoch >= self.batches_per_epoch {
            return Err(DataError::SeekOutOfRange {
                epoch: position.epoch,
                batch_in_epoch: position.batch_in_epoch,
                batches_per_epoch: self.batches_per_epoch,
            });
        }
        self.position = position;
        Ok(())
    }

    /// Fills this rank's `inputs` and `targets` (each `batch_size × seq_len`, row-major (B, T))
    /// with the next batch: `targets[b][t]` is the token after `inputs[b][t]`. Advances the
    /// position, rolling over to the next epoch (and its new order) after the last batch.
    /// Returns the position of the batch just produced.
    pub fn next_batch(&mut self, inputs: &mut [u32], targets: &mut [u32]) -> LoaderPosition {
        let shape = self.config.shape;
        let produced = self.position;
        self.prepare_order(produced.epoch);
        let first_row =
            produced.batch_in_epoch as usize * shape.global_rows() + shape.rank * shape.batch_size;
        shape.fill_rows(&self.tokens, inputs, targets, |row| {
            let window = self.order[first_row + row] as usize;
            self.range.start + window * shape.seq_len
        });
        self.position.batch_in_epoch += 1;
        if self.position.batch_in_epoch == self.batches_per_epoch {
            self.position = LoaderPosition {
                epoch: produced.epoch + 1,
                batch_in_epoch: 0,
            };
        }
        produced
    }

    /// Fills `order` with the window order of `epoch`, unless it already holds it.
    fn prepare_order(&mut self, epoch: u64) {
        if self.order_epoch == Some(epoch) {
            return;
        }
        for (i, slot) in self.order.iter_mut().enumerate() {
            *slot = i as u32;
        }
        if let WindowOrder::Shuffled { seed } = self.config.order {
            SplitMix64::for_epoch(seed, epoch).shuffle(&mut self.order);
        }
        self.order_epoch = Some(epoch);
    }
}
