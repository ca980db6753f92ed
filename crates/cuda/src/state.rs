//! The training-state ops of `engine::Backend` on the GPU (fills, sums of squares, scaling,
//! accumulation, AdamW / SGD / the fp32-master AdamW) and everything that crosses to the host:
//! uploads and downloads, the offloaded master step, fp16 underflow statistics and the
//! collectives, which stage through host memory into this rank's `comm` (no NCCL yet).
//!
//! Example: `sum_squares(gpu, arena, grads, 0.0)`: 1024 block partials in f64, added on the
//! host in block order.

use crate::device::{Arg, Cuda, BLAS_WORKSPACE_BYTES, REDUCE_BLOCKS};
use crate::ops::{at, code, elementwise, ptr, THREADS};
use comm::{Buf, BufMut, Collective, CommError, ReduceOp};
use cudarc::driver::result;
use engine::backend::{AdamW, CommOp, DType, MasterAdamW, MasterAdamWHost, Sgd, Tensor};
use engine::precision::{adamw_master_step, Grads, UnderflowStats, Working};
use engine::Arena;
use half::{bf16, f16};
use kernels::convert;

type A = Arena<Cuda>;

impl Cuda {
    fn bind(&self) {
        self.ctx.bind_to_thread().expect("CUDA context");
    }

    /// `bytes` from device address `src` to `dst`.
    pub(crate) fn copy(&self, dst: u64, src: u64, bytes: usize) {
        if bytes == 0 || dst == src {
            return;
        }
        self.bind();
        // SAFETY: both ranges lie in live arena tensors of `bytes` bytes.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) }
            .expect("CUDA device copy");
    }

    /// Host → device, waiting for the copy (the host buffer may go away after).
    pub(crate) fn write<T>(&self, dst: u64, src: &[T]) {
        if src.is_empty() {
            return;
        }
        self.bind();
        // SAFETY: `dst` addresses a live tensor of at least `size_of_val(src)` bytes.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }.expect("CUDA upload");
        self.sync();
    }

    /// Device → host, after every op launched before.
    pub(crate) fn read<T>(&self, dst: &mut [T], src: u64) {
        if dst.is_empty() {
            return;
        }
        self.bind();
        // SAFETY: `src` addresses a live tensor of at least `size_of_val(dst)` bytes.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }.expect("CUDA download");
        self.sync();
    }

    pub(crate) fn download_f32(&self, src: u64, dst: &mut [f32]) {
        self.read(dst, src);
    }
}

/// Writes `src` into `dst`, rounded to a 2-byte `dst` (the CPU's `kernels::convert`).
pub fn upload(gpu: &Cuda, a: &A, dst: Tensor, src: &[f32]) {
    assert_eq!(
        dst.len,
        src.len(),
        "upload of {} into {} elements",
        src.len(),
        dst.len
    );
    match dst.dtype {
        DType::F32 => gpu.write(at(a, dst), src),
        DType::Bf16 => {
            let mut h = vec![bf16::ZERO; src.len()];
            convert::f32_to_bf16(&mut h, src);
            gpu.write(at(a, dst), &h);
        }
        DType::F16 => {
            let mut h = vec![f16::ZERO; src.len()];
            convert::f32_to_f16(&mut h, src);
            gpu.write(at(a, dst), &h);
        }
        DType::U32 | DType::U8 | DType::I8 => panic!("upload ids with upload_ids"),
    }
}

/// Reads `src` into `dst`, widened from a 2-byte `src`.
pub fn download(gpu: &Cuda, a: &A, src: Tensor, dst: &mut [f32]) {
    assert_eq!(
        src.len,
        dst.len(),
        "download of {} into {} elements",
        src.len,
        dst.len()
    );
    match src.dtype {
        DType::F32 => gpu.read(dst, at(a, src)),
        DType::Bf16 => {
            let mut h = vec![bf16::ZERO; src.len];
            gpu.read(&mut h, at(a, src));
            convert::bf16_to_f32(dst, &h);
        }
        DType::F16 => {
            let mut h = vec![f16::ZERO; src.len];
            gpu.read(&mut h, at(a, src));
            convert::f16_to_f32(dst, &h);
        }
        DType::U32 | DType::U8 | DType::I8 => panic!("token ids are not weights"),
    }
}

/// A tensor's raw bytes, little-endian (what `upload_bytes` and `download_bytes` move).
pub fn read_bytes(gpu: &Cuda, a: &A, t: Tensor) -> Vec<u8> {
    let mut out = vec![0u8; t.len * t.dtype.size_bytes()];
    gpu.read(&mut out, at(a, t));
    out
}

pub fn write_bytes(gpu: &Cuda, a: &A, t: Tensor, src: &[u8]) {
    assert_eq!(
        src.len(),
        t.len * t.dtype.size_bytes(),
        "bytes of the tensor"
    );
    gpu.write(at(a, t), src);
}

pub fn fill(gpu: &Cuda, a: &A, t: Tensor, value: f32) {
    let (name, bits) = match t.dtype {
        DType::F32 => ("fill_u32", value.to_bits()),
        DType::U32 => ("fill_u32", value as u32),
        DType::Bf16 => ("fill_u16", u32::from(bf16::from_f32(value).to_bits())),
        DType::F16 => ("fill_u16", u32::from(f16::from_f32(value).to_bits())),
        DType::U8 | DType::I8 => {
            let byte = if t.dtype == DType::U8 {
                value as u8
            } else {
                value as i8 as u8
            };
            gpu.bind();
            // SAFETY: the tensor's bytes.
            unsafe { result::memset_d8_async(at(a, t), byte, t.len, gpu.cu_stream()) }
                .expect("CUDA memset");
            return;
        }
    };
    elementwise(
        gpu,
        name,
        t.len,
        &[ptr(a, t), Arg::U64(t.len as u64), Arg::I32(bits as i32)],
    );
}

pub fn sum_squares(gpu: &Cuda, a: &A, t: Tensor, start: f64) -> (f64, bool) {
    let partials = gpu.scratch + BLAS_WORKSPACE_BYTES;
    let args = [
        Arg::Ptr(partials),
        ptr(a, t),
        code(t.dtype),
        Arg::U64(t.len as u64),
    ];
    gpu.launch("sum_squares", u64::from(REDUCE_BLOCKS), THREADS, &args);
    let mut host = vec![0.0f64; REDUCE_BLOCKS as usize];
    gpu.read(&mut host, partials);
    let sum = start + host.iter().sum::<f64>();
    // Squares are never negative: the sum is non-finite exactly when an element is.
    (sum, !sum.is_finite())
}

pub fn scale(gpu: &Cuda, a: &A, t: Tensor, factor: f32) {
    let args = [ptr(a, t), Arg::U64(t.len as u64), Arg::F32(factor)];
    elementwise(gpu, "scale", t.len, &args);
}

pub fn accumulate(gpu: &Cuda, a: &A, acc: Tensor, x: Tensor) {
    assert_eq!(acc.len, x.len, "accumulate keeps the element count");
    let args = [
        ptr(a, acc),
        code(acc.dtype),
        ptr(a, x),
        code(x.dtype),
        Arg::U64(x.len as u64),
    ];
    elementwise(gpu, "accumulate", x.len, &args);
}

/// `kernels::adamw::update`'s per-step constants, computed the same way (f64 corrections).
fn adam_args(opt: kernels::adamw::AdamW, step: u32) -> [Arg; 6] {
    let bc1 = 1.0 - f64::from(opt.beta1).powi(step as i32);
    let bc2 = 1.0 - f64::from(opt.beta2).powi(step as i32);
    [
        Arg::F32(opt.beta1),
        Arg::F32(opt.beta2),
        Arg::F32(opt.eps),
        Arg::F32((f64::from(opt.lr) / bc1) as f32),
        Arg::F32(bc2.sqrt() as f32),
        Arg::F32(1.0 - opt.lr * opt.weight_decay),
    ]
}

pub fn adamw(gpu: &Cuda, a: &A, op: &AdamW) {
    assert!(op.step >= 1, "AdamW steps count from 1");
    let n = op.params.len;
    let mut args = vec![
        ptr(a, op.params),
        ptr(a, op.grads),
        ptr(a, op.m),
        ptr(a, op.v),
        Arg::U64(n as u64),
    ];
    args.extend(adam_args(op.opt, op.step));
    elementwise(gpu, "adamw", n, &args);
}

pub fn sgd(gpu: &Cuda, a: &A, op: &Sgd) {
    let n = op.params.len;
    let buf = if op.opt.momentum == 0.0 {
        Arg::Ptr(0)
    } else {
        ptr(a, op.momentum)
    };
    let args = [
        ptr(a, op.params),
        ptr(a, op.grads),
        buf,
        Arg::U64(n as u64),
        Arg::F32(op.opt.lr),
        Arg::F32(op.opt.momentum),
        Arg::F32(op.opt.weight_decay),
    ];
    elementwise(gpu, "sgd", n, &args);
}

pub fn master_adamw(gpu: &Cuda, a: &A, op: &MasterAdamW) {
    assert!(op.step.step >= 1, "AdamW steps count from 1");
    assert_eq!(
        op.grads.dtype, op.working.dtype,
        "gradients and working copy share a format"
    );
    let n = op.master.len;
    let mut args = vec![
        ptr(a, op.master),
        ptr(a, op.m),
        ptr(a, op.v),
        ptr(a, op.grads),
        ptr(a, op.working),
        code(op.grads.dtype),
        Arg::U64(n as u64),
        Arg::F32(op.step.grad_multiplier),
    ];
    args.extend(adam_args(op.step.opt, op.step.step));
    elementwise(gpu, "master_adamw", n, &args);
}

/// The offloaded master step: the 2-byte gradients come to the host, the CPU's step runs on
/// the host master weights and moments, the rounded working copy goes back.
pub fn master_adamw_host(gpu: &Cuda, a: &A, op: MasterAdamWHost<'_>) {
    let n = op.grads.len;
    let (grads, working) = (at(a, op.grads), at(a, op.working));
    match op.grads.dtype {
        DType::Bf16 => {
            let (mut g, mut w) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
            gpu.read(&mut g, grads);
            let (gr, wk) = (Grads::Bf16(&g), Some(Working::Bf16(&mut w)));
            adamw_master_step(op.master, op.m, op.v, gr, wk, op.step);
            gpu.write(working, &w);
        }
        DType::F16 => {
            let (mut g, mut w) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
            gpu.read(&mut g, grads);
            let (gr, wk) = (Grads::F16(&g), Some(Working::F16(&mut w)));
            adamw_master_step(op.master, op.m, op.v, gr, wk, op.step);
            gpu.write(working, &w);
        }
        other => panic!("master weights step 2-byte gradients, not {other:?}"),
    }
}

pub fn underflow(gpu: &Cuda, a: &A, t: Tensor) -> UnderflowStats {
    let mut host = vec![0.0f32; t.len];
    gpu.read(&mut host, at(a, t));
    UnderflowStats::measure(&host, 1.0)
}

/// The first `t.len` 2-byte elements at `t`'s start, widened in place to f32 (through the host:
/// in place on the device, element i's write would race with element 2i's read).
pub fn widen_in_place(gpu: &Cuda, a: &A, t: Tensor, half: DType) {
    let mut wide = vec![0.0f32; t.len];
    if half == DType::Bf16 {
        let mut h = vec![bf16::ZERO; t.len];
        gpu.read(&mut h, at(a, t));
        convert::bf16_to_f32(&mut wide, &h);
    } else {
        let mut h = vec![f16::ZERO; t.len];
        gpu.read(&mut h, at(a, t));
        convert::f16_to_f32(&mut wide, &h);
    }
    gpu.write(at(a, t), &wide);
}

/// A tensor's elements on the host as a collective buffer (fp16 bits travel as bf16 words, as
/// on the CPU: gathers copy bits and the engine reduces 2-byte values only as fp32).
enum Host {
    F32(Vec<f32>),
    Half(Vec<bf16>),
}

impl Host {
    fn read(gpu: &Cuda, a: &A, t: Tensor) -> Host {
        match t.dtype {
            DType::F32 => {
                let mut v = vec![0.0f32; t.len];
                gpu.read(&mut v, at(a, t));
                Host::F32(v)
            }
            DType::Bf16 | DType::F16 => {
                let mut v = vec![bf16::ZERO; t.len];
                gpu.read(&mut v, at(a, t));
                Host::Half(v)
            }
            DType::U32 | DType::U8 | DType::I8 => panic!("collectives carry weights and gradients"),
        }
    }

    fn buf(&self) -> Buf<'_> {
        match self {
            Host::F32(v) => Buf::F32(v),
            Host::Half(v) => Buf::Bf16(v),
        }
    }

    fn buf_mut(&mut self) -> BufMut<'_> {
        match self {
            Host::F32(v) => BufMut::F32(v),
            Host::Half(v) => BufMut::Bf16(v),
        }
    }

    fn write(&self, gpu: &Cuda, a: &A, t: Tensor) {
        match self {
            Host::F32(v) => gpu.write(at(a, t), v),
            Host::Half(v) => gpu.write(at(a, t), v),
        }
    }
}

pub fn collective(
    gpu: &Cuda,
    a: &A,
    comm: &mut dyn Collective,
    op: CommOp,
) -> Result<(), CommError> {
    if comm.world_size() == 1 {
        // A world of one: the in-place collectives leave the tensor as it is; the others copy.
        match op {
            CommOp::AllGather { src, dst } | CommOp::ReduceScatter { src, dst } => {
                crate::ops::convert(gpu, a, dst.prefix(src.len), src)
            }
            CommOp::AllReduce(_)
            | CommOp::ReduceScatterInPlace(_)
            | CommOp::AllGatherInPlace(_) => {}
        }
        return Ok(());
    }
    let in_place = |t: Tensor, f: &mut dyn FnMut(BufMut<'_>) -> Result<(), CommError>| {
        let mut h = Host::read(gpu, a, t);
        f(h.buf_mut())?;
        h.write(gpu, a, t);
        Ok(())
    };
    match op {
        CommOp::AllReduce(t) => in_place(t, &mut |b| comm.all_reduce(b, ReduceOp::Sum)),
        CommOp::ReduceScatterInPlace(t) => {
            in_place(t, &mut |b| comm.reduce_scatter_in_place(b, ReduceOp::Sum))
        }
        CommOp::AllGatherInPlace(t) => in_place(t, &mut |b| comm.all_gather_in_place(b)),
        CommOp::ReduceScatter { src, dst } => {
            assert!(src.dtype == DType::F32, "partial sums are f32");
            let s = Host::read(gpu, a, src);
            let mut d = Host::read(gpu, a, dst);
            comm.reduce_scatter(s.buf(), d.buf_mut(), ReduceOp::Sum)?;
            d.write(gpu, a, dst);
            Ok(())
        }
        CommOp::AllGather { src, dst } => {
            let s = Host::read(gpu, a, src);
            let mut d = Host::read(gpu, a, dst);
            comm.all_gather(s.buf(), d.buf_mut())?;
            d.write(gpu, a, dst);
            Ok(())
        }
    }
}
