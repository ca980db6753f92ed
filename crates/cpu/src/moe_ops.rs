//! The CPU backend's mixture-of-experts and latent-attention ops: `kernels::moe` and
//! `kernels::mla` on the tensors' slices.
//!
//! Example: `moe(arena, &MoeOp::Gather { .. })` copies rows into expert order.

use super::Cpu;
use crate::Views;
use engine::arena::Arena;
use engine::backend::infer_ops::LatentOp;
use engine::backend::moe_ops::{MlaOp, MoeOp};
use engine::backend::DType;
use half::bf16;
use kernels::{mla, moe};

pub fn moe(a: &Arena<Cpu>, op: &MoeOp) {
    match *op {
        MoeOp::Route {
            probs,
            gates,
            route,
            shape: s,
            routing,
            aux,
        } => {
            let mut p = a.view_mut::<f32>(probs);
            let mut g = a.view_mut::<f32>(gates);
            let mut r = a.view_mut::<u32>(route);
            let mut aux = aux.map(|t| a.view_mut::<f32>(t));
            let aux = aux.as_deref_mut();
            moe::route(&mut p, &mut g, &mut r, s.n, s.experts, s.k, routing, aux);
        }
        MoeOp::Gather {
            dst,
            src,
            route,
            shape: s,
            c,
        } => {
            let r = a.view::<u32>(route);
            match src.dtype {
                DType::Bf16 => {
                    let src = a.view::<bf16>(src);
                    moe::gather(&mut a.view_mut::<bf16>(dst), &src, &r, s.n, s.k, c);
                }
                _ => {
                    let src = a.view::<f32>(src);
                    moe::gather(&mut a.view_mut::<f32>(dst), &src, &r, s.n, s.k, c);
                }
            }
        }
        MoeOp::Combine {
            out,
            residual,
            y,
            gates,
            route,
            shape: s,
            c,
        } => {
            let (r, y) = (a.view::<u32>(route), a.view::<f32>(y));
            let gates = gates.map(|g| a.view::<f32>(g));
            let mut out = a.view_mut::<f32>(out);
            if let Some(res) = residual {
                out.copy_from_slice(&a.view::<f32>(res));
            }
            moe::combine(&mut out, &y, gates.as_deref(), &r, s.n, s.k, c);
        }
        MoeOp::ScaleRows {
            x,
            gates,
            route,
            shape: s,
            w,
        } => {
            let (r, g) = (a.view::<u32>(route), a.view::<f32>(gates));
            moe::scale_rows(&mut a.view_mut::<f32>(x), &g, &r, s.n, s.k, w);
        }
        MoeOp::GateGrads {
            dgates,
            a: x,
            b,
            route,
            shape: s,
            w,
        } => {
            let (r, x) = (a.view::<u32>(route), a.view::<f32>(x));
            let mut dg = a.view_mut::<f32>(dgates);
            match b.dtype {
                DType::Bf16 => {
                    let b = a.view::<bf16>(b);
                    moe::gate_grads(&mut dg, &x, &b, |v| v.to_f32(), &r, s.n, s.k, w);
                }
                _ => {
                    let b = a.view::<f32>(b);
                    moe::gate_grads(&mut dg, &x, &b, |v| v, &r, s.n, s.k, w);
                }
            }
        }
        MoeOp::RouteBackward {
            dlogits,
            dgates,
            probs,
            route,
            shape: s,
            gating,
            dprob,
        } => {
            let (dg, p, r) = (
                a.view::<f32>(dgates),
                a.view::<f32>(probs),
                a.view::<u32>(route),
            );
            let dprob = dprob.map(|t| a.view::<f32>(t));
            let mut dl = a.view_mut::<f32>(dlogits);
            let dims = (s.n, s.experts, s.k);
            moe::route_backward(&mut dl, &dg, &p, &r, dims, gating, dprob.as_deref());
        }
    }
}

pub fn mla(a: &Arena<Cpu>, op: &MlaOp) {
    match *op {
        MlaOp::Assemble {
            qkv,
            q,
            kv,
            ckv,
            n,
            dims,
        } => {
            let (q, kv, ckv) = (a.view::<f32>(q), a.view::<f32>(kv), a.view::<f32>(ckv));
            mla::assemble(&mut a.view_mut::<f32>(qkv), &q, &kv, &ckv, n, dims);
        }
        MlaOp::Disassemble {
            dq,
            dkv,
            dckv,
            dqkv,
            n,
            dims,
        } => {
            let g = a.view::<f32>(dqkv);
            let (mut dq, mut dkv) = (a.view_mut::<f32>(dq), a.view_mut::<f32>(dkv));
            mla::disassemble(&mut dq, &mut dkv, &mut a.view_mut::<f32>(dckv), &g, n, dims);
        }
        MlaOp::Rope {
            qkv,
            batch,
            seq,
            dims,
            theta,
            inverse,
        } => {
            let width = 3 * dims.heads * dims.qk();
            let mut x = a.view_mut::<f32>(qkv);
            mla::rope_interleaved(&mut x, (batch, seq), dims, width, theta, inverse);
        }
        MlaOp::TakeValues {
            out,
            padded,
            n,
            dims,
        } => {
            let p = a.view::<f32>(padded);
            mla::take_values(&mut a.view_mut::<f32>(out), &p, n, dims);
        }
        MlaOp::PutValues {
            padded,
            dout,
            n,
            dims,
        } => {
            let d = a.view::<f32>(dout);
            mla::put_values(&mut a.view_mut::<f32>(padded), &d, n, dims);
        }
        MlaOp::Latent {
            latent,
            ckv,
            n,
            dims,
            back,
        } => {
            let mut l = a.view_mut::<f32>(latent);
            mla::latent(&mut l, &mut a.view_mut::<f32>(ckv), n, dims, back);
        }
    }
}

pub fn latent(a: &Arena<Cpu>, op: &LatentOp) {
    match *op {
        LatentOp::RopeAt {
            x,
            positions,
            row_width,
            heads,
            stride,
            offset,
            rope,
            theta,
        } => {
            let mut x = a.view_mut::<f32>(x);
            let layout = (heads, stride, offset);
            mla::rope_at(&mut x, positions, row_width, layout, rope, theta);
        }
        LatentOp::Write {
            cache,
            ckv,
            slots,
            block,
        } => {
            let rows = a.view::<f32>(ckv);
            let width = rows.len() / slots.len().max(1);
            match cache.dtype {
                DType::Bf16 => {
                    let mut c = a.view_mut::<bf16>(cache);
                    mla::latent_write(&mut c, &rows, slots, block, width);
                }
                _ => {
                    let mut c = a.view_mut::<f32>(cache);
                    mla::latent_write(&mut c, &rows, slots, block, width);
                }
            }
        }
        LatentOp::Attention {
            out,
            q,
            cache,
            rows,
            block,
            w_kvb,
            dims,
            scale,
        } => {
            let (q, w) = (a.view::<f32>(q), a.view::<f32>(w_kvb));
            let seqs: Vec<mla::LatentRow> = rows
                .iter()
                .map(|r| mla::LatentRow {
                    blocks: r.blocks,
                    len: r.len,
                })
                .collect();
            let mut o = a.view_mut::<f32>(out);
            match cache.dtype {
                DType::Bf16 => {
                    let c = a.view::<bf16>(cache);
                    mla::latent_attention(&mut o, &q, &c, &seqs, block, &w, dims, scale);
                }
                _ => {
                    let c = a.view::<f32>(cache);
                    mla::latent_attention(&mut o, &q, &c, &seqs, block, &w, dims, scale);
                }
            }
        }
    }
}
