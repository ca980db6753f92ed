//! Sequence parallelism (Megatron-LM, Korthikanti et al. 2022) over a tensor-parallel group: the
//! norms' region (the residual stream, each norm's output and statistics, the embedding's
//! output) holds only this rank's rows of the micro-batch (contiguous: rank r has rows
//! r·N/T..(r+1)·N/T of the B·T tokens), so those activations are 1/T of a tensor-parallel
//! rank's. Around each tensor-parallel region the rows meet:
//! - forward: a norm's output is all-gathered whole for the column-parallel GEMM
//!   (`work.sp_gather`); a row-parallel projection's partial sum (`work.sp_full`) is
//!   reduce-scattered into this rank's rows, where the residual is added;
//! - backward: the residual gradient is all-gathered for the row-parallel projection's
//!   backward, the norm's output gathered again for the column-parallel weight gradient, and
//!   the partial input gradient reduce-scattered back to this rank's rows;
//! - a norm's weight (and bias) gradient over this rank's rows is only part of it: it is
//!   computed into `work.sp_dnorm`, summed over the group, then added to the gradient (without
//!   that sum the ranks' norm weights drift apart, the classic silent bug).
//!
//! Example: `let ln1 = sp::gathered(model, arena, a.ln1, n_local * c);` before the qkv GEMM.

use crate::arena::Arena;
use crate::backend::{Backend, CommOp, Tensor};
use crate::model::Model;

/// Sequence parallelism's workspaces in the arena.
#[derive(Clone, Copy, Debug)]
pub struct SpWork {
    /// `work.sp_gather`: a norm's output gathered whole (N × C, the matmul inputs' type).
    pub gather: Tensor,
    /// `work.sp_full`: partial sums and gathered gradients (N × C, f32).
    pub full: Tensor,
    /// `work.sp_dnorm`: a norm's weight and bias gradient over this rank's rows (2C).
    pub dnorm: Tensor,
}

/// This rank's first row and row count of a pass of `n` rows (all of them without sequence
/// parallelism).
pub fn rows(model: &Model, n: usize) -> (usize, usize) {
    match (&model.sp, &model.tp) {
        (Some(_), Some(tp)) => {
            let local = n / tp.size as usize;
            (tp.rank as usize * local, local)
        }
        _ => (0, n),
    }
}

fn run<B: Backend>(model: &Model, arena: &Arena<B>, op: CommOp) {
    let tp = model
        .tp
        .as_ref()
        .expect("sequence parallelism runs in a tensor-parallel group");
    tp.collective(arena, op);
}

/// `local` (this rank's `len` elements of a norm's output) gathered whole into
/// `work.sp_gather`; `local` itself without sequence parallelism.
pub fn gathered<B: Backend>(model: &Model, arena: &Arena<B>, local: Tensor, len: usize) -> Tensor {
    gather_into(model, arena, local, len, |sp| sp.gather)
}

/// The residual gradient `local` (this rank's `len` elements) gathered whole into
/// `work.sp_full`; `local` itself without sequence parallelism.
pub fn gathered_grad<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    local: Tensor,
    len: usize,
) -> Tensor {
    gather_into(model, arena, local, len, |sp| sp.full)
}

/// Every rank's `len` elements of `local` gathered, in rank order, into the workspace `dst`
/// picks (of `local`'s type).
fn gather_into<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    local: Tensor,
    len: usize,
    dst: impl FnOnce(&SpWork) -> Tensor,
) -> Tensor {
    let Some(sp) = model.sp else {
        return local.prefix(len);
    };
    let world = model.tp.as_ref().map_or(1, |t| t.size as usize);
    let dst = dst(&sp);
    assert_eq!(local.dtype, dst.dtype, "a gather keeps its rows' type");
    let dst = dst.prefix(len * world);
    let src = local.prefix(len);
    run(model, arena, CommOp::AllGather { src, dst });
    dst
}

/// Where a row-parallel projection of `n_c` elements (all rows) writes its partial sum: the
/// output itself (summed in place by the caller's all-reduce) or `work.sp_full`.
pub fn partial_target(model: &Model, out: Tensor, n_c: usize) -> Tensor {
    match model.sp {
        Some(sp) => sp.full.prefix(n_c),
        None => out.prefix(n_c),
    }
}

/// Sums a row-parallel projection's partial output over the group: in place (tensor
/// parallelism), or this rank's rows of the sum from `work.sp_full` into `out` (sequence
/// parallelism). `n_c` is the elements of every row.
pub fn sum_partial<B: Backend>(model: &Model, arena: &Arena<B>, out: Tensor, n_c: usize) {
    let Some(tp) = &model.tp else { return };
    match model.sp {
        Some(sp) => {
            let local = n_c / tp.size as usize;
            run(
                model,
                arena,
                CommOp::ReduceScatter {
                    src: sp.full.prefix(n_c),
                    dst: out.prefix(local),
                },
            );
        }
        None => tp.all_reduce(arena, out.prefix(n_c)),
    }
}

/// Sums a column-parallel projection's partial input gradient `t` (all rows) over the group:
/// whole on every rank (tensor parallelism), or this rank's rows of the sum left in its slice
/// (sequence parallelism; returned).
pub fn sum_input_grad<B: Backend>(model: &Model, arena: &Arena<B>, t: Tensor) -> Tensor {
    let Some(tp) = &model.tp else { return t };
    match model.sp {
        Some(_) => {
            run(model, arena, CommOp::ReduceScatterInPlace(t));
            let local = t.len / tp.size as usize;
            t.slice(tp.rank as usize * local..(tp.rank as usize + 1) * local)
        }
        None => {
            tp.all_reduce(arena, t);
            t
        }
    }
}
