//! LoRA's ops on the CPU: `kernels::dequant` into the planned scratch, then `kernels::lora`'s
//! column GEMMs and adapter products.

use super::Cpu;
use crate::Views;
use engine::arena::Arena;
use engine::backend::lora_ops::*;
use engine::backend::Backend;
use engine::backend::Tensor;
use kernels::dequant::dequantize_range;
use kernels::lora::Weights;
use plan_frugal::adapters::DEQUANT_TILE_ROWS;

type A = Arena<Cpu>;

/// The tables the NF4 layouts index: the 16 levels and bitsandbytes' dynamic map.
fn tables() -> &'static ([f32; 16], [f32; 256]) {
    static TABLES: std::sync::OnceLock<([f32; 16], [f32; 256])> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let levels = std::array::from_fn(|i| formats::NF4_LEVELS[i] as f32);
        (levels, formats::bnb::dynamic_map())
    })
}

/// Runs `gemm(weight tile, first row, rows)` over each part (rows, IC) of `w`, with the part:
/// the stored f32 weight whole for an fp32 base, else tiles of `DEQUANT_TILE_ROWS` rows
/// dequantized into the scratch.
fn for_tiles(a: &A, w: &FrozenWeight, mut gemm: impl FnMut(&FrozenPart, Tensor, usize, usize)) {
    for part in w.parts.iter().flatten() {
        let Some(stored) = engine::lora::base::stored(w.format, w.role, part.rows) else {
            gemm(part, part.src, 0, part.rows);
            continue;
        };
        let scratch = w.scratch.expect("a quantized base has a dequant scratch");
        let (levels, map) = tables();
        let tile = DEQUANT_TILE_ROWS as usize;
        for r0 in (0..part.rows).step_by(tile) {
            let rows = tile.min(part.rows - r0);
            let dst = scratch.prefix(rows * w.ic);
            {
                let src = a.view::<u8>(part.src);
                let mut out = a.view_mut::<f32>(dst);
                let (n, at) = (part.rows * w.ic, r0 * w.ic);
                dequantize_range(&mut out, &src, stored, n, at, levels, map);
            }
            gemm(part, dst, r0, rows);
        }
    }
}

pub fn frozen_linear(a: &A, op: &FrozenLinear) {
    let FrozenWeight { n, ic, oc, .. } = op.w;
    for_tiles(a, &op.w, |part, w, r0, rows| {
        let col0 = part.col0 + r0;
        let bias = op.bias.map(|b| b.slice(col0..col0 + rows));
        let (x, w) = (a.view::<f32>(op.inp), a.view::<f32>(w));
        let bias = bias.map(|b| a.view::<f32>(b));
        let mut out = a.view_mut::<f32>(op.out);
        let cols = (col0, rows);
        kernels::lora::forward_cols(&mut out, &x, &w, bias.as_deref(), (n, ic, oc), cols);
    });
}

pub fn frozen_linear_backward(a: &A, op: &FrozenLinearBackward) {
    let FrozenWeight { n, ic, oc, .. } = op.w;
    for_tiles(a, &op.w, |part, w, r0, rows| {
        let (dout, w) = (a.view::<f32>(op.dout), a.view::<f32>(w));
        let mut dinp = a.view_mut::<f32>(op.dinp);
        let cols = (part.col0 + r0, rows);
        kernels::lora::backward_input_cols(&mut dinp, &dout, &w, (n, ic, oc), cols);
    });
}

/// The adapter parts' B views (borrowed) in order.
fn parts_of<'v>(
    bs: &'v [Option<super::View<'v, f32>>; MAX_PARTS],
    op: &Adapter,
) -> Vec<kernels::lora::Part<'v>> {
    (op.parts.iter().zip(bs))
        .filter_map(|(p, b)| {
            let (p, b) = (p.as_ref()?, b.as_ref()?);
            Some(kernels::lora::Part {
                b,
                col0: p.col0,
                rows: p.rows,
            })
        })
        .collect()
}

/// The adapter's input: `inp`, or with dropout its dropped copy rebuilt in the scratch.
fn adapter_input(a: &A, op: &Adapter) -> Tensor {
    let Some(d) = op.dropout else {
        return op.inp;
    };
    let dropped = d.dropped.prefix(op.inp.len);
    let x = a.view::<f32>(op.inp);
    let mut out = a.view_mut::<f32>(dropped);
    kernels::lora::dropout(&mut out, &x, d.p, d.seed);
    dropped
}

pub fn adapter(a: &A, op: &Adapter) {
    let inp = adapter_input(a, op);
    let bs = op.parts.map(|p| p.map(|p| a.view::<f32>(p.b)));
    let parts = parts_of(&bs, op);
    let (x, a_cat) = (a.view::<f32>(inp), a.view::<f32>(op.a_cat));
    let mut u = a.view_mut::<f32>(op.u);
    let (n, ic, oc, r) = (op.n, op.ic, op.oc, op.rank);
    match op.out {
        Some(out) => {
            let mut out = a.view_mut::<f32>(out);
            let lora = Weights {
                a_cat: &a_cat,
                parts: &parts,
                rank: r,
                scale: op.scale,
            };
            kernels::lora::adapter_forward(&mut out, &mut u, &x, &lora, (n, ic, oc));
        }
        None => kernels::lora::adapter_u(&mut u, &x, &a_cat, n, ic, r * parts.len()),
    }
}

pub fn adapter_backward(a: &A, op: &AdapterBackward) {
    let f = &op.fwd;
    let inp = adapter_input(a, f);
    // With dropout the adapter's input gradient lands in the scratch, masked into dinp after.
    let dinp = match f.dropout {
        Some(d) => {
            let dx =
                d.dx.expect("the backward has the dropout's gradient scratch");
            let dx = dx.prefix(op.dinp.len);
            a.backend().fill(a, dx, 0.0);
            dx
        }
        None => op.dinp,
    };
    adapter_products(a, op, inp, dinp);
    if let Some(d) = f.dropout {
        let dx = a.view::<f32>(dinp);
        let mut into = a.view_mut::<f32>(op.dinp);
        kernels::lora::dropout_backward(&mut into, &dx, d.p, d.seed);
    }
}

/// dB, dA_cat and `dinp` += the adapter's products on the input `inp`.
fn adapter_products(a: &A, op: &AdapterBackward, inp: Tensor, dinp: Tensor) {
    let f = &op.fwd;
    let bs = f.parts.map(|p| p.map(|p| a.view::<f32>(p.b)));
    let parts = parts_of(&bs, f);
    let (x, a_cat, u) = (
        a.view::<f32>(inp),
        a.view::<f32>(f.a_cat),
        a.view::<f32>(f.u),
    );
    let dout = a.view::<f32>(op.dout);
    let mut dinp = a.view_mut::<f32>(dinp);
    let mut du = a.view_mut::<f32>(op.du.prefix(f.u.len));
    let [d0, d1, d2] = op.db;
    let mut grads = a.parts_mut::<f32, 4>([Some(op.da_cat), d0, d1, d2]);
    let [da, rest @ ..] = &mut grads.parts;
    let da = da.as_deref_mut().expect("dA");
    let mut db: Vec<&mut [f32]> = rest.iter_mut().filter_map(|d| d.as_deref_mut()).collect();
    let shape = (f.n, f.ic, f.oc);
    let lora = Weights {
        a_cat: &a_cat,
        parts: &parts,
        rank: f.rank,
        scale: f.scale,
    };
    kernels::lora::adapter_backward(&mut dinp, da, &mut db, &mut du, &dout, &x, &u, &lora, shape);
}
