//! Tensor-parallel inference: one rank of a group that splits the model as training does
//! (Megatron-LM, `plan_frugal::tp`). A rank's worker is the single-rank worker of its share
//! (`tp::rank_shape`: its query heads, its key/value heads or the one it shares, its slice of the
//! MLP and of the vocabulary), so its plan is the serving plan of that shape and measures
//! exactly as one rank does. The ranks meet at four points of a step:
//! - the embedding: each rank looks up the tokens of its vocabulary slice (zero rows for the
//!   others), rank 0 adds learned positions, and the group sums the rows;
//! - after the attention output projection and after the MLP down projection (row-parallel):
//!   the group sums the partial outputs, rank 0 alone having added the bias. Latent attention
//!   splits its heads (each rank caches the whole latent) and a mixture of experts every
//!   expert's MLP (the router is whole, so every rank routes alike): both end in the same sum;
//! - the head (vocabulary-parallel): each rank computes its slice's logits, gathered whole on
//!   the host, so every rank samples the same token from the same numbers.
//!
//! Quantized weights are cut from the whole model's fp32 values and quantized per rank; the
//! row-parallel slices must hold whole groups (`tp::check_groups`), and int8's one scale per row
//! is the whole row's, so every rank's codes and scales are the whole model's. (The int8 kernel
//! quantizes its activations per row, which a rank sees only its slice of: int8 runs may part
//! from one rank's within int8's error; fp32 and bf16 agree up to the order of sums, and int4
//! and nf4 too but for the integer kernels' int8-rounded activations, where a last-bit
//! difference can flip one rounding.)
//!
//! Example: `engine::world::launch(2, timeout, |comm| { let mut w = Worker::tensor_parallel(
//! cpu::Cpu::new(), config.clone(), setup, comm, None)?; w.load_whole_units(&units)?; ... })`.

use super::weights::{pack, Packed, StoredMatrix};
use super::Worker;
use comm::Collective;
use engine::arena::Arena;
use engine::backend::{InferOps, Tensor};
use engine::config::ModelConfig;
use engine::error::EngineError;
use engine::share::Share;
use engine::tp::TensorParallel;
use plan_frugal::pp::Stage;
use plan_frugal::tp::Split;
use plan_frugal::{serve_plan_rank, tp, ServeSetup, WeightFormat};
use std::cell::RefCell;

/// A worker's place in its tensor-parallel group.
pub(crate) struct TpRank {
    pub link: TensorParallel,
    /// The whole model the ranks' shares are cut from.
    pub whole: ModelConfig,
    /// Every rank's vocabulary rows, in rank order.
    widths: Vec<usize>,
    /// Host scratch of the logits gather: this rank's rows (padded), then every rank's.
    local: RefCell<Vec<f32>>,
    gathered: RefCell<Vec<f32>>,
}

impl TpRank {
    /// Whether this rank adds what is added once (biases of row-parallel projections, learned
    /// positions).
    pub fn lead(&self) -> bool {
        self.link.rank == 0
    }

    /// Sums `t` over the group (a failure is kept for the step's end).
    pub fn sum<B: InferOps>(&self, a: &Arena<B>, t: Tensor) {
        self.link.all_reduce(a, t);
    }

    /// `rows` rows of this rank's logits (`out`, its vocabulary slice) gathered into the whole
    /// vocabulary's rows in `logits`.
    pub fn gather_logits<B: InferOps>(
        &self,
        a: &Arena<B>,
        out: Tensor,
        rows: usize,
        logits: &mut Vec<f32>,
    ) {
        let mine = self.widths[self.link.rank as usize];
        let width = *self.widths.iter().max().expect("a group");
        let (mut local, mut all) = (self.local.borrow_mut(), self.gathered.borrow_mut());
        // This rank's rows, then spread to the widest slice's stride: a gather moves equal
        // lengths.
        local.resize(rows * width, 0.0);
        a.backend().download(a, out, &mut local[..rows * mine]);
        for r in (0..rows).rev() {
            local.copy_within(r * mine..(r + 1) * mine, r * width);
            local[r * width + mine..(r + 1) * width].fill(0.0);
        }
        all.resize(rows * width * self.widths.len(), 0.0);
        self.link.gather_host(&local, &mut all);
        let vocab: usize = self.widths.iter().sum();
        logits.resize(rows * vocab, 0.0);
        for (r, row) in logits.chunks_exact_mut(vocab).enumerate() {
            let mut at = 0;
            for (k, &w) in self.widths.iter().enumerate() {
                let theirs = &all[(k * rows + r) * width..][..w];
                row[at..at + w].copy_from_slice(theirs);
                at += w;
            }
        }
    }
}

impl<B: InferOps> Worker<B> {
    /// Rank `comm.rank()` of a tensor-parallel group of `comm.world_size()` ranks serving the
    /// whole model `config`: the worker of its share, sized by `setup` (refused before
    /// allocating past `capacity`), weights zeroed. A model the group cannot split, or
    /// quantization groups a slice would cut, is refused naming the numbers.
    pub fn tensor_parallel(
        backend: B,
        config: ModelConfig,
        setup: ServeSetup,
        comm: Box<dyn Collective>,
        capacity: Option<u64>,
    ) -> Result<Worker<B>, EngineError> {
        let (size, rank) = (comm.world_size() as u32, comm.rank() as u32);
        if size == 1 {
            return Worker::on(backend, config, setup, capacity);
        }
        let whole = &config.shape;
        engine::backend::require::<B>(engine::backend::model_needs(whole))?;
        let plan = serve_plan_rank(whole, &setup, size, rank)?;
        let units = tp::units(whole, size, rank, 1)?;
        let rank_config = ModelConfig {
            shape: tp::rank_shape(whole, size, rank),
            ..config.clone()
        };
        let mut worker = Worker::with_plan(backend, rank_config, setup, capacity, (plan, units))?;
        let vocab = whole.vocab;
        worker.tp = Some(TpRank {
            link: TensorParallel::new(vocab, comm),
            widths: (0..size)
                .map(|r| tp::vocab_range(vocab, size, r).1 as usize)
                .collect(),
            whole: config,
            local: RefCell::new(Vec::new()),
            gathered: RefCell::new(Vec::new()),
        });
        Ok(worker)
    }

    /// Loads the whole model's fp32 units (as [`Worker::load_units`] takes them), keeping this
    /// rank's share of each.
    pub fn load_whole_units(&mut self, whole: &[Vec<f32>]) -> Result<(), EngineError> {
        let Some(share) = self.share()? else {
            return self.load_units(whole);
        };
        let mine = self.shares_of(&share, whole);
        self.load_units(&mine)?;
        if self.setup.weights == WeightFormat::Int8 {
            self.whole_row_scales(&share, whole)?;
        }
        Ok(())
    }

    /// As [`Worker::load_whole_units`], with the whole model's matrices that `stored` gives in
    /// the `ggml` format (a GGUF file's blocks, exact): each rank keeps its rows of those bytes,
    /// or each row's columns in whole groups, so its values are the file's.
    pub fn load_whole_units_with(
        &mut self,
        whole: &[Vec<f32>],
        stored: &mut StoredMatrix<'_>,
    ) -> Result<(), EngineError> {
        let Some(share) = self.share()? else {
            return self.load_units_with(whole, stored);
        };
        let WeightFormat::Ggml { group, .. } = self.setup.weights else {
            return self.load_whole_units(whole);
        };
        let rank = share.tp_rank;
        let mine = self.shares_of(&share, whole);
        self.load_units_with(&mine, &mut |unit, view| {
            let w = &share.whole_units[share.whole_index(unit.kind)];
            let wv = w.view(view.role);
            let Some(p) = stored(w, wv)? else {
                return Ok(None);
            };
            let (rows, cols) = (wv.shape[0] as usize, wv.shape[1] as usize);
            take_grouped(
                &share.split(view.role, rank),
                rows,
                cols,
                group as usize,
                &p,
            )
            .map(Some)
        })
    }

    /// How this tensor-parallel rank's units are cut from the whole model's; `None` alone.
    fn share(&self) -> Result<Option<Share>, EngineError> {
        let Some(t) = &self.tp else {
            return Ok(None);
        };
        let stage = Stage::whole(t.whole.shape.n_layers);
        Ok(Some(Share::new(
            t.whole.clone(),
            (t.link.rank, t.link.size),
            stage,
        )?))
    }

    /// This rank's share of each whole unit's fp32 values.
    fn shares_of(&self, share: &Share, whole: &[Vec<f32>]) -> Vec<Vec<f32>> {
        self.units
            .iter()
            .map(|unit| {
                let values = &whole[share.whole_index(unit.kind)];
                let mut part = vec![0.0f32; unit.padded_numel as usize];
                share.take_unit(unit, values, &mut part);
                part
            })
            .collect()
    }

    /// int8 keeps one scale per row of the whole matrix: a row-parallel slice (some columns of
    /// every row) is quantized with its whole rows' scales, so its codes are the whole model's.
    fn whole_row_scales(&self, share: &Share, whole: &[Vec<f32>]) -> Result<(), EngineError> {
        for (u, unit) in self.units.iter().enumerate() {
            let w = &share.whole_units[share.whole_index(unit.kind)];
            for v in &unit.views {
                let (rows, whole_cols) = match w.view(v.role).shape.as_slice() {
                    &[r, c] => (r as usize, c as usize),
                    _ => continue,
                };
                let Split::Cols(first, cols) =
                    tp::split(&share.whole.shape, v.role, share.tp_size, share.tp_rank)
                else {
                    continue;
                };
                let wv = w.view(v.role);
                let values =
                    &whole[share.whole_index(unit.kind)][wv.offset as usize..][..rows * whole_cols];
                let p = pack(WeightFormat::Int8, values, rows, whole_cols)?;
                let (first, cols) = (first as usize, cols as usize);
                let codes = p
                    .codes
                    .chunks_exact(whole_cols)
                    .flat_map(|row| &row[first..first + cols])
                    .copied()
                    .collect();
                let part = Packed { codes, ..p };
                self.upload_matrix(&self.weights[u].matrix(v.role), &part);
            }
        }
        Ok(())
    }

    /// The rank and size of this worker's tensor-parallel group (0 of 1 alone).
    pub fn tp_rank(&self) -> (u32, u32) {
        self.tp
            .as_ref()
            .map_or((0, 1), |t| (t.link.rank, t.link.size))
    }

    /// The whole model's vocabulary: the width of a row of logits.
    pub fn vocab(&self) -> usize {
        match &self.tp {
            Some(t) => t.whole.shape.vocab as usize,
            None => self.config.shape.vocab as usize,
        }
    }

    /// The first failed collective of the last step, if any.
    pub(crate) fn tp_check(&self) -> Result<(), EngineError> {
        self.tp.as_ref().map_or(Ok(()), |t| t.link.check())
    }
}

/// A rank's share of a whole (rows, cols) matrix in the `ggml` format: row ranges of its codes,
/// scales and minima, or each row's columns `first..first + cols` when those are whole groups.
fn take_grouped(
    split: &Split,
    rows: usize,
    cols: usize,
    group: usize,
    p: &Packed,
) -> Result<Packed, EngineError> {
    // Bytes per row of each stored array: an int8 code a column, 4 bytes a group.
    let arrays = [
        (&p.codes, cols),
        (&p.scales, 4 * cols / group),
        (&p.zeros, 4 * cols / group),
    ];
    let cut = |keep: &dyn Fn(&[u8], usize) -> Vec<u8>| -> Vec<Vec<u8>> {
        arrays
            .iter()
            .map(|&(a, row)| {
                if a.is_empty() {
                    Vec::new()
                } else {
                    keep(a, row)
                }
            })
            .collect()
    };
    let parts = match split {
        Split::Whole => return Ok(p.clone()),
        Split::Rows(ranges) => cut(&|a, row| {
            ranges
                .iter()
                .flat_map(|&(first, n)| &a[first as usize * row..(first + n) as usize * row])
                .copied()
                .collect()
        }),
        Split::Cols(first, n) => {
            let (first, n) = (*first as usize, *n as usize);
            if first % group != 0 || n % group != 0 {
                return Err(EngineError::Infer(format!(
                    "a rank's columns {first}..{} do not hold whole groups of {group}",
                    first + n
                )));
            }
            cut(&|a, row| {
                let (from, len) = (first * row / cols, n * row / cols);
                (0..rows)
                    .flat_map(|r| &a[r * row + from..r * row + from + len])
                    .copied()
                    .collect()
            })
        }
    };
    let [codes, scales, zeros]: [Vec<u8>; 3] = parts.try_into().expect("three arrays");
    Ok(Packed {
        codes,
        scales,
        zeros,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed ggml bytes dequantized: scale · code + min per group.
    fn values(p: &Packed, group: usize) -> Vec<f32> {
        let f = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (scales, mins) = (f(&p.scales), f(&p.zeros));
        p.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| scales[i / group] * f32::from(c as i8) + mins[i / group])
            .collect()
    }

    #[test]
    fn a_ranks_share_of_ggml_bytes_holds_the_values_of_its_share() {
        let (rows, cols, group) = (4usize, 64usize, 16usize);
        let groups = rows * cols / group;
        let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 37 % 251) as u8).collect();
        let scales: Vec<f32> = (0..groups).map(|g| 0.01 * (g + 1) as f32).collect();
        let mins: Vec<f32> = (0..groups).map(|g| -0.1 * g as f32).collect();
        let whole = Packed::grouped(codes, &scales, &mins);
        let dense = values(&whole, group);
        let shape = [rows as u64, cols as u64];
        for split in [
            Split::Whole,
            Split::Rows(vec![(1, 2)]),
            Split::Rows(vec![(0, 1), (3, 1)]),
            Split::Cols(16, 32),
        ] {
            let part = take_grouped(&split, rows, cols, group, &whole).unwrap();
            let mut want = vec![0.0f32; part.codes.len()];
            plan_frugal::tp::take(&split, &shape, &dense, &mut want);
            assert_eq!(values(&part, group), want, "{split:?}");
        }
        // Columns that cut a group are refused.
        assert!(take_grouped(&Split::Cols(8, 32), rows, cols, group, &whole).is_err());
    }
}
