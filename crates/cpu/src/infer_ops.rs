//! The CPU backend's inference ops: views of the arena handed to `kernels::qmatmul` (weight-only
//! quantized products, f32 weights over many rows through faer's GEMM) and
//! `kernels::paged_attention` (KV writes, decode attention, block copies).

use crate::Cpu;
use crate::Views;
use engine::arena::Arena;
use engine::backend::infer_ops::*;
use engine::backend::ops::RopeShape;
use engine::backend::{DType, Tensor};
use half::{bf16, f16};
use kernels::paged_attention::{self as pa, KvShape, KvSlice, KvSliceMut, RowCtx};
use kernels::qmatmul::{self, QWeight};
use plan_frugal::{KvFormat, Roles, WeightFormat};

/// The QLoRA NormalFloat4 levels as f32 (the formats crate's table).
fn nf4_levels() -> [f32; 16] {
    std::array::from_fn(|i| formats::NF4_LEVELS[i] as f32)
}

/// Borrows `m`'s tensors and runs `f` on the kernels' view of them.
fn with_weight<R>(a: &Arena<Cpu>, m: &QMatrix, f: impl FnOnce(&QWeight) -> R) -> R {
    let levels = nf4_levels();
    match m.format {
        WeightFormat::F32 => f(&QWeight::F32(&a.view::<f32>(m.codes))),
        WeightFormat::Bf16 => f(&QWeight::Bf16(&a.view::<bf16>(m.codes))),
        WeightFormat::Int8 => {
            let (codes, scales) = (a.view::<i8>(m.codes), a.view::<f16>(m.scales.unwrap()));
            let (codes, scales) = (&codes[..], &scales[..]);
            match a.backend().tiled(m) {
                true => f(&QWeight::Int8Tiled { codes, scales }),
                false => f(&QWeight::Int8 { codes, scales }),
            }
        }
        WeightFormat::Int4 { group, .. } => {
            let codes = a.view::<u8>(m.codes);
            let scales = a.view::<f16>(m.scales.unwrap());
            let zeros = m.zeros.map(|z| a.view::<u8>(z));
            let (codes, scales, zeros, group) = (&codes, &scales, zeros.as_deref(), group as usize);
            match a.backend().tiled(m) {
                true => f(&QWeight::Int4Tiled {
                    codes,
                    scales,
                    zeros,
                    group,
                }),
                false => f(&QWeight::Int4 {
                    codes,
                    scales,
                    zeros,
                    group,
                }),
            }
        }
        WeightFormat::Ggml { group, nibbles } if nibbles == Roles::ALL => {
            let codes = a.view::<u8>(m.codes);
            let scales = a.view::<f32>(m.scales.unwrap());
            let mins = m.zeros.map(|z| a.view::<f32>(z));
            f(&QWeight::Grouped4 {
                codes: &codes,
                scales: &scales,
                mins: mins.as_deref(),
                group: group as usize,
            })
        }
        WeightFormat::Ggml { group, .. } => {
            let codes = a.view::<i8>(m.codes);
            let scales = a.view::<f32>(m.scales.unwrap());
            let mins = m.zeros.map(|z| a.view::<f32>(z));
            f(&QWeight::Grouped {
                codes: &codes,
                scales: &scales,
                mins: mins.as_deref(),
                group: group as usize,
            })
        }
        WeightFormat::Nf4 { group } => {
            let codes = a.view::<u8>(m.codes);
            let scales = a.view::<f32>(m.scales.unwrap());
            let (codes, scales, levels, group) = (&codes, &scales, &levels, group as usize);
            match a.backend().tiled(m) {
                true => f(&QWeight::Nf4Tiled {
                    codes,
                    scales,
                    levels,
                    group,
                }),
                false => f(&QWeight::Nf4 {
                    codes,
                    scales,
                    levels,
                    group,
                }),
            }
        }
    }
}

pub(super) fn qlinear(a: &Arena<Cpu>, op: &QLinear) {
    let (n, ic, oc) = (op.n, op.weight.cols, op.weight.rows);
    let inp = a.view::<f32>(op.inp.prefix(n * ic));
    let mut out = a.view_mut::<f32>(op.out.prefix(n * oc));
    // One kernel for every row count, f32 included (not faer's GEMM for long prefills): a row's
    // sum is then the same in a prefill, a decode or a verification step, which greedy
    // speculative and batched decoding rely on to match plain decoding token for token.
    with_weight(a, &op.weight, |w| {
        qmatmul::matmul(&mut out, &inp, w, n, ic, oc)
    });
    if let Some(bias) = op.bias {
        let bias = a.view::<f32>(bias);
        for row in out.chunks_exact_mut(oc) {
            for (o, b) in row.iter_mut().zip(bias.iter()) {
                *o += b;
            }
        }
    }
}

pub(super) fn embed_rows(a: &Arena<Cpu>, op: &EmbedRows) {
    let c = op.table.cols;
    let n = op.positions.len();
    let tokens = a.view::<u32>(op.tokens.prefix(n));
    let mut out = a.view_mut::<f32>(op.out.prefix(n * c));
    with_weight(a, &op.table, |w| {
        let (first, held) = (op.shard.unwrap_or(0), op.table.rows);
        for (row, &t) in out.chunks_exact_mut(c).zip(tokens.iter()) {
            match (t as usize).checked_sub(first).filter(|&i| i < held) {
                Some(i) => w.row(i, row),
                None => row.fill(0.0),
            }
        }
    });
    if let Some(wpe) = op.wpe {
        let wpe = a.view::<f32>(wpe);
        for (row, &p) in out.chunks_exact_mut(c).zip(op.positions) {
            for (o, x) in row
                .iter_mut()
                .zip(&wpe[p as usize * c..(p as usize + 1) * c])
            {
                *o += x;
            }
        }
    }
}

pub(super) fn rope_at(a: &Arena<Cpu>, qkv: Tensor, positions: &[u32], s: RopeShape) {
    let mut x = a.view_mut::<f32>(qkv.prefix(positions.len() * s.row_width));
    let heads = (s.heads, s.head_dim, s.row_width);
    kernels::rope::forward_at(&mut x, positions, heads, s.theta);
}

fn shape(c: &KvCache) -> KvShape {
    KvShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        block: c.block,
    }
}

/// Mutable views of one of the cache's two sides (keys: `values` false).
fn side_mut<R>(
    a: &Arena<Cpu>,
    c: &KvCache,
    values: bool,
    f: impl FnOnce(&mut KvSliceMut) -> R,
) -> R {
    let (t, s) = if values {
        (c.v, c.v_scales)
    } else {
        (c.k, c.k_scales)
    };
    match c.format {
        KvFormat::F32 => f(&mut KvSliceMut::F32(&mut a.view_mut::<f32>(t))),
        KvFormat::Bf16 => f(&mut KvSliceMut::Bf16(&mut a.view_mut::<bf16>(t))),
        KvFormat::Int8 => {
            let (mut codes, mut scales) = (a.view_mut::<i8>(t), a.view_mut::<f32>(s.unwrap()));
            f(&mut KvSliceMut::Int8 {
                codes: &mut codes,
                scales: &mut scales,
            })
        }
        KvFormat::Fp8 => {
            let (mut codes, mut scales) = (a.view_mut::<u8>(t), a.view_mut::<f32>(s.unwrap()));
            f(&mut KvSliceMut::Fp8 {
                codes: &mut codes,
                scales: &mut scales,
            })
        }
    }
}

fn sides<R>(a: &Arena<Cpu>, c: &KvCache, f: impl FnOnce(&KvSlice, &KvSlice) -> R) -> R {
    match c.format {
        KvFormat::F32 => {
            let (k, v) = (a.view::<f32>(c.k), a.view::<f32>(c.v));
            f(&KvSlice::F32(&k), &KvSlice::F32(&v))
        }
        KvFormat::Bf16 => {
            let (k, v) = (a.view::<bf16>(c.k), a.view::<bf16>(c.v));
            f(&KvSlice::Bf16(&k), &KvSlice::Bf16(&v))
        }
        KvFormat::Int8 => {
            let (k, v) = (a.view::<i8>(c.k), a.view::<i8>(c.v));
            let (ks, vs) = (
                a.view::<f32>(c.k_scales.unwrap()),
                a.view::<f32>(c.v_scales.unwrap()),
            );
            f(
                &KvSlice::Int8 {
                    codes: &k,
                    scales: &ks,
                },
                &KvSlice::Int8 {
                    codes: &v,
                    scales: &vs,
                },
            )
        }
        KvFormat::Fp8 => {
            let (k, v) = (a.view::<u8>(c.k), a.view::<u8>(c.v));
            let (ks, vs) = (
                a.view::<f32>(c.k_scales.unwrap()),
                a.view::<f32>(c.v_scales.unwrap()),
            );
            f(
                &KvSlice::Fp8 {
                    codes: &k,
                    scales: &ks,
                },
                &KvSlice::Fp8 {
                    codes: &v,
                    scales: &vs,
                },
            )
        }
    }
}

pub(super) fn kv_write(a: &Arena<Cpu>, op: &KvWrite) {
    let c = &op.cache;
    let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let width = q + 2 * kv;
    let qkv = a.view::<f32>(op.qkv.prefix(op.slots.len() * width));
    let sh = shape(c);
    for values in [false, true] {
        side_mut(a, c, values, |cache| {
            for (row, &(block, slot)) in qkv.chunks_exact(width).zip(op.slots) {
                let src = if values {
                    &row[q + kv..]
                } else {
                    &row[q..q + kv]
                };
                pa::write(cache, src, block as usize, slot as usize, &sh);
            }
        });
    }
}

pub(super) fn paged_attention(a: &Arena<Cpu>, op: &PagedAttention) {
    let c = &op.cache;
    let n = op.rows.len();
    let width = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
    let qkv = a.view::<f32>(op.qkv.prefix(n * width));
    let mut out = a.view_mut::<f32>(op.out.prefix(n * c.n_heads * c.head_dim));
    let rows: Vec<RowCtx> = op
        .rows
        .iter()
        .map(|r| RowCtx {
            blocks: r.blocks,
            start: r.start,
            len: r.len,
        })
        .collect();
    let sh = shape(c);
    let mut none: [f32; 0] = [];
    let mut parts = op
        .partials
        .filter(|_| op.splits > 1)
        .map(|p| a.view_mut::<f32>(p));
    let partials: &mut [f32] = match parts.as_deref_mut() {
        Some(p) => p,
        None => &mut none,
    };
    let splits = if partials.is_empty() { 1 } else { op.splits };
    sides(a, c, |k, v| {
        pa::attend(&mut out, &qkv, width, &rows, k, v, &sh, splits, partials)
    });
}

pub(super) fn kv_copy_block(a: &Arena<Cpu>, c: &KvCache, from: usize, to: usize) {
    let sh = shape(c);
    for values in [false, true] {
        side_mut(a, c, values, |cache| pa::copy_block(cache, from, to, &sh));
    }
}

pub(crate) fn upload_bytes(a: &Arena<Cpu>, dst: Tensor, src: &[u8]) {
    let n = dst.len * dst.dtype.size_bytes();
    assert_eq!(src.len(), n, "{} bytes for a tensor of {n}", src.len());
    let raw = Tensor {
        dtype: DType::U8,
        offset: dst.offset * dst.dtype.size_bytes(),
        len: n,
        ..dst
    };
    a.view_mut::<u8>(raw).copy_from_slice(src);
}

pub(crate) fn download_bytes(a: &Arena<Cpu>, src: Tensor, dst: &mut [u8]) {
    let n = src.len * src.dtype.size_bytes();
    let raw = Tensor {
        dtype: DType::U8,
        offset: src.offset * src.dtype.size_bytes(),
        len: n,
        ..src
    };
    dst.copy_from_slice(&a.view::<u8>(raw));
}
