//! The CPU backend's training-state ops: zeroing, sums of squares, scaling, accumulation into
//! 2-byte gradients, AdamW / SGD / the fp32-master AdamW (on the arena or on host memory),
//! fp16 underflow statistics, host transfers and the collectives over arena tensors. Each is the
//! loop the engine ran before the backend seam, with the same chunking, so results are
//! bit-identical and independent of the thread count.
//!
//! Example: `sum_squares(cpu, arena, grads, 0.0)` is the f64 sum of squares in 2^16-element
//! chunks, added in chunk order.

use super::Cpu;
use crate::Views;
use comm::{Buf, BufMut, Collective, CommError, ReduceOp, Ticket};
use engine::arena::Arena;
use engine::backend::ops::*;
use engine::backend::{DType, Tensor};
use engine::precision::{adamw_master_step, Grads, UnderflowStats, Working};
use half::{bf16, f16};
use kernels::{adamw, convert, sgd};
use rayon::prelude::*;

type A = Arena<Cpu>;

/// Elements per rayon task of the memory-bound f32 passes.
const CHUNK: usize = 1 << 16;
/// Elements per task of the 2-byte passes (and per block of a 2-byte sum of squares).
const HALF_CHUNK: usize = 1 << 14;

pub fn fill(a: &A, t: Tensor, value: f32) {
    match t.dtype {
        DType::F32 => a
            .view_mut::<f32>(t)
            .par_chunks_mut(CHUNK)
            .for_each(|c| c.fill(value)),
        DType::U32 => a.view_mut::<u32>(t).fill(value as u32),
        DType::U8 => a.view_mut::<u8>(t).fill(value as u8),
        DType::I8 => a.view_mut::<i8>(t).fill(value as i8),
        DType::Bf16 => a.view_mut::<bf16>(t).fill(bf16::from_f32(value)),
        DType::F16 => a.view_mut::<f16>(t).fill(f16::from_f32(value)),
    }
}

/// Σ g² of `c` in f64: eight independent lanes (so the loop vectorises), added in lane order,
/// then the tail; the same for every thread count, since chunks are fixed.
fn sum_sq(c: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let body = c.chunks_exact(8);
    let tail: f64 = body
        .remainder()
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum();
    for x in body {
        for (a, &g) in acc.iter_mut().zip(x) {
            *a += f64::from(g) * f64::from(g);
        }
    }
    acc.iter().sum::<f64>() + tail
}

pub fn sum_squares(cpu: &Cpu, a: &A, t: Tensor, start: f64) -> (f64, bool) {
    let sq = sum_sq;
    if t.dtype == DType::F32 {
        let g = a.view::<f32>(t);
        let mut partials = cpu.partials.lock().unwrap_or_else(|e| e.into_inner());
        g.par_chunks(CHUNK).map(sq).collect_into_vec(&mut partials);
        let sum = start + partials.iter().sum::<f64>();
        // A non-finite element makes the sum non-finite.
        return (sum, !sum.is_finite());
    }
    // 2-byte values: each chunk widened block by block on its task's stack, the chunks'
    // partials added in chunk order (as a serial pass would: the same bits).
    let mut partials = cpu.half_partials.lock().unwrap_or_else(|e| e.into_inner());
    match t.dtype {
        DType::Bf16 => a
            .view::<bf16>(t)
            .par_chunks(HALF_CHUNK)
            .map(|c| sum_sq_half(c.len(), |x, r| convert::bf16_to_f32(x, &c[r])))
            .collect_into_vec(&mut partials),
        _ => a
            .view::<f16>(t)
            .par_chunks(HALF_CHUNK)
            .map(|c| sum_sq_half(c.len(), |x, r| convert::f16_to_f32(x, &c[r])))
            .collect_into_vec(&mut partials),
    }
    partials
        .iter()
        .fold((start, false), |(sum, inf), &(s, i)| (sum + s, inf | i))
}

/// Widened elements per stack block of [`sum_sq_half`] (a multiple of its 8 lanes).
const WIDE_BLOCK: usize = 1024;

/// [`sum_sq`] of `len` 2-byte values that `widen` writes as f32 (`widen(dst, range)`), and
/// whether any is non-finite: widened a block at a time into a stack buffer, with the same
/// eight lanes, order and tail as `sum_sq` over the whole widened chunk.
fn sum_sq_half(len: usize, widen: impl Fn(&mut [f32], std::ops::Range<usize>)) -> (f64, bool) {
    let mut buf = [0.0f32; WIDE_BLOCK];
    let (mut acc, mut inf) = ([0.0f64; 8], false);
    let body = len - len % 8;
    let mut at = 0;
    while at < body {
        let end = (at + WIDE_BLOCK).min(body);
        let x = &mut buf[..end - at];
        widen(x, at..end);
        inf |= x.iter().any(|v| !v.is_finite());
        for c in x.chunks_exact(8) {
            for (a, &g) in acc.iter_mut().zip(c) {
                *a += f64::from(g) * f64::from(g);
            }
        }
        at = end;
    }
    let x = &mut buf[..len - body];
    widen(x, body..len);
    inf |= x.iter().any(|v| !v.is_finite());
    let tail: f64 = x.iter().map(|&g| f64::from(g) * f64::from(g)).sum();
    (acc.iter().sum::<f64>() + tail, inf)
}

pub fn scale(a: &A, t: Tensor, factor: f32) {
    a.view_mut::<f32>(t)
        .par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|g| *g *= factor));
}

pub fn accumulate(a: &A, acc: Tensor, x: Tensor) {
    if x.dtype == DType::Bf16 {
        // A 2-byte gradient span (`plan_frugal::shards::direct_grads`) into its accumulator.
        assert_eq!(
            acc.dtype,
            DType::Bf16,
            "a bf16 gradient accumulates into bf16"
        );
        return add_into_bf16(a, acc, &a.view::<bf16>(x), |g| g.to_f32());
    }
    let g = a.view::<f32>(x);
    match acc.dtype {
        DType::F32 => {
            let mut acc = a.view_mut::<f32>(acc);
            acc.iter_mut().zip(g.iter()).for_each(|(a, &g)| *a += g);
        }
        DType::Bf16 => add_into_bf16(a, acc, &g, |g| g),
        DType::F16 => a
            .view_mut::<f16>(acc)
            .par_chunks_mut(HALF_CHUNK)
            .zip(g.par_chunks(HALF_CHUNK))
            .for_each(|(a, g)| {
                a.iter_mut()
                    .zip(g)
                    .for_each(|(a, &g)| *a = f16::from_f32(a.to_f32() + g))
            }),
        DType::U32 | DType::U8 | DType::I8 => panic!("gradients are not token ids"),
    }
}

/// bf16 `acc` += `g` (widened by `wide`), each element rounded once, in parallel chunks.
fn add_into_bf16<T: Copy + Sync>(a: &A, acc: Tensor, g: &[T], wide: impl Fn(T) -> f32 + Sync) {
    a.view_mut::<bf16>(acc)
        .par_chunks_mut(HALF_CHUNK)
        .zip(g.par_chunks(HALF_CHUNK))
        .for_each(|(a, g)| {
            (a.iter_mut().zip(g)).for_each(|(a, &g)| *a = bf16::from_f32(a.to_f32() + wide(g)))
        });
}

pub fn adamw_step(a: &A, op: &AdamW) {
    let g = a.view::<f32>(op.grads);
    let mut p = a.view_mut::<f32>(op.params);
    let (mut m, mut v) = (a.view_mut::<f32>(op.m), a.view_mut::<f32>(op.v));
    adamw::update(&mut p, &g, &mut m, &mut v, op.opt, op.step);
}

pub fn sgd_step(a: &A, op: &Sgd) {
    let g = a.view::<f32>(op.grads);
    let mut p = a.view_mut::<f32>(op.params);
    let mut buf = a.view_mut::<f32>(op.momentum);
    sgd::update(&mut p, &g, &mut buf, op.opt);
}

/// The 2-byte gradients and working copy of a master step, borrowed from the arena.
fn with_half<R>(
    a: &A,
    grads: Tensor,
    working: Tensor,
    f: impl FnOnce(Grads<'_>, Working<'_>) -> R,
) -> R {
    match grads.dtype {
        DType::Bf16 => {
            let g = a.view::<bf16>(grads);
            let mut w = a.view_mut::<bf16>(working);
            f(Grads::Bf16(&g), Working::Bf16(&mut w))
        }
        DType::F16 => {
            let g = a.view::<f16>(grads);
            let mut w = a.view_mut::<f16>(working);
            f(Grads::F16(&g), Working::F16(&mut w))
        }
        other => panic!("master weights step 2-byte gradients, not {other:?}"),
    }
}

pub fn master_adamw(a: &A, op: &MasterAdamW) {
    let mut master = a.view_mut::<f32>(op.master);
    let (mut m, mut v) = (a.view_mut::<f32>(op.m), a.view_mut::<f32>(op.v));
    with_half(a, op.grads, op.working, |g, w| {
        adamw_master_step(&mut master, &mut m, &mut v, g, Some(w), op.step)
    });
}

pub fn master_adamw_host(a: &A, op: MasterAdamWHost<'_>) {
    let (master, m, v) = (op.master, op.m, op.v);
    with_half(a, op.grads, op.working, |g, w| {
        adamw_master_step(master, m, v, g, Some(w), op.step)
    });
}

pub fn underflow(a: &A, t: Tensor) -> UnderflowStats {
    // Scaled already (the loss scale seeded the backward): measure at 1.
    UnderflowStats::measure(&a.view::<f32>(t), 1.0)
}

pub fn widen_in_place(a: &A, t: Tensor, half: DType) {
    let mut words = a.view_mut::<u32>(Tensor {
        dtype: DType::U32,
        ..t
    });
    // Element i's 2 bytes sit in word i / 2 <= i, which the descending loop has not
    // overwritten yet.
    for i in (0..t.len).rev() {
        let w = words[i / 2];
        let b = (if i % 2 == 0 { w & 0xffff } else { w >> 16 }) as u16;
        let x = match half {
            DType::Bf16 => bf16::from_bits(b).to_f32(),
            _ => f16::from_bits(b).to_f32(),
        };
        words[i] = x.to_bits();
    }
}

pub fn upload(a: &A, dst: Tensor, src: &[f32]) {
    match dst.dtype {
        DType::F32 => a.view_mut::<f32>(dst).copy_from_slice(src),
        DType::Bf16 => convert::f32_to_bf16(&mut a.view_mut::<bf16>(dst), src),
        DType::F16 => convert::f32_to_f16(&mut a.view_mut::<f16>(dst), src),
        DType::U32 | DType::U8 | DType::I8 => panic!("upload ids with upload_ids"),
    }
}

pub fn download(a: &A, src: Tensor, dst: &mut [f32]) {
    match src.dtype {
        DType::F32 => dst.copy_from_slice(&a.view::<f32>(src)),
        DType::Bf16 => convert::bf16_to_f32(dst, &a.view::<bf16>(src)),
        DType::F16 => convert::f16_to_f32(dst, &a.view::<f16>(src)),
        DType::U32 | DType::U8 | DType::I8 => panic!("token ids are not weights"),
    }
}

/// fp16 bits travel through the collectives as bf16-typed words: gathers copy bits and never
/// add them, and the engine reduces 2-byte values only as fp32.
fn as_bf16(x: &[f16]) -> &[bf16] {
    // SAFETY: same size, alignment and validity (every u16 is a valid bf16).
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const bf16, x.len()) }
}

fn as_bf16_mut(x: &mut [f16]) -> &mut [bf16] {
    // SAFETY: as in `as_bf16`.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut bf16, x.len()) }
}

fn with_buf<R>(a: &A, t: Tensor, f: impl FnOnce(Buf<'_>) -> R) -> R {
    match t.dtype {
        DType::F32 => f(Buf::F32(&a.view::<f32>(t))),
        DType::Bf16 => f(Buf::Bf16(&a.view::<bf16>(t))),
        DType::F16 => f(Buf::Bf16(as_bf16(&a.view::<f16>(t)))),
        DType::U32 | DType::U8 | DType::I8 => panic!("collectives carry weights and gradients"),
    }
}

fn with_buf_mut<R>(a: &A, t: Tensor, f: impl FnOnce(BufMut<'_>) -> R) -> R {
    match t.dtype {
        DType::F32 => f(BufMut::F32(&mut a.view_mut::<f32>(t))),
        DType::Bf16 => f(BufMut::Bf16(&mut a.view_mut::<bf16>(t))),
        DType::F16 => f(BufMut::Bf16(as_bf16_mut(&mut a.view_mut::<f16>(t)))),
        DType::U32 | DType::U8 | DType::I8 => panic!("collectives carry weights and gradients"),
    }
}

/// An `AllGather` started on `comm` (the buffers' bits travel as they lie, fp16 as bf16-typed
/// words); any other op runs blocking.
///
/// # Safety
/// As `Backend::start_collective`.
pub unsafe fn start_collective(
    a: &A,
    comm: &mut dyn Collective,
    op: CommOp,
) -> Result<Ticket, CommError> {
    let CommOp::AllGather { src, dst } = op else {
        return collective(a, comm, op).map(|()| Ticket::DONE);
    };
    // The views are released when this returns; the caller's promise keeps the bytes to `comm`.
    with_buf(a, src, |s| {
        with_buf_mut(a, dst, |d| unsafe { comm.start_all_gather(s, d) })
    })
}

pub fn collective(a: &A, comm: &mut dyn Collective, op: CommOp) -> Result<(), CommError> {
    match op {
        CommOp::AllReduce(t) => with_buf_mut(a, t, |b| comm.all_reduce(b, ReduceOp::Sum)),
        CommOp::ReduceScatterInPlace(t) => {
            with_buf_mut(a, t, |b| comm.reduce_scatter_in_place(b, ReduceOp::Sum))
        }
        CommOp::AllGatherInPlace(t) => with_buf_mut(a, t, |b| comm.all_gather_in_place(b)),
        CommOp::ReduceScatter { src, dst } => {
            assert!(src.dtype == DType::F32, "partial sums are f32");
            let s = a.view::<f32>(src);
            with_buf_mut(a, dst, |d| {
                comm.reduce_scatter(Buf::F32(&s), d, ReduceOp::Sum)
            })
        }
        CommOp::AllGather { src, dst } => {
            with_buf(a, src, |s| with_buf_mut(a, dst, |d| comm.all_gather(s, d)))
        }
    }
}
