//! Multi-head latent attention's backward: the gradients of the latent projections, norms and
//! rotary parts, from `engine::mla`'s forward saves.

use crate::backward::{Grad, NormSaved};
use engine::backend::ops::*;
use engine::backend::TrainOps;
use engine::backend::{MlaOp, Tensor};
use engine::forward::{attn_shape, widened};
use engine::mla::{dims, must, work};
use engine::model::BlockActs;
use plan_frugal::units::Role;

/// The attention half's backward: d(res2) in `dresidual` → d(inp), with every latent-attention
/// weight's gradient.
pub fn backward<B: TrainOps>(g: &Grad<'_, B>, a: &BlockActs, inp: Tensor) {
    let (model, state, arena, be) = (g.model, g.state, g.arena, g.be);
    let layer = g.layer();
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let d = model.dims(layer, b, t);
    let (m, k) = dims(&d);
    let w = work(model);
    let (n, c) = (d.n as usize, d.c as usize);
    let (qkv_w, atty_w, hqk) = (d.qkv as usize, d.atty as usize, k.heads * k.qk());
    let dres = state.dresidual;
    let datty = state.datty.prefix(n * atty_w);
    be.fill(arena, datty, 0.0);
    let proj = (Role::AttnProjWeight, Role::AttnProjBias);
    g.linear(datty, dres, a.atty, proj, atty_w);
    let padded = w.q.prefix(n * hqk);
    let put = MlaOp::PutValues {
        padded,
        dout: datty,
        n,
        dims: k,
    };
    engine::backend::moe_ops(be).mla(arena, &put);
    let qkv = widened(arena, a.qkv, n * qkv_w, model.work.f32_in);
    let dqkv = state.dqkv.prefix(n * qkv_w);
    be.fill(arena, dqkv, 0.0);
    let kernel = match (a.att, a.lse, state.datt) {
        (Some(att), _, Some(datt)) => AttnGradKernel::Materialised { att, datt },
        (None, Some(lse), _) => AttnGradKernel::Flash {
            out: must(a.atty_pad).prefix(n * hqk),
            lse,
        },
        _ => panic!("the plan keeps neither att (with dact.att) nor lse"),
    };
    let op = AttentionBackward {
        dqkv,
        dout: padded,
        qkv,
        kernel,
        shape: attn_shape(model, g.kind, b, t),
    };
    be.attention_backward(arena, &op);
    let rope = MlaOp::Rope {
        qkv: dqkv,
        batch: b,
        seq: t,
        dims: k,
        theta: model.config.rope_theta,
        inverse: true,
    };
    engine::backend::moe_ops(be).mla(arena, &rope);
    let (dq, dkv) = (
        w.q.prefix(n * hqk),
        w.kv.prefix(n * k.heads * (k.nope + k.v)),
    );
    let dckv = w.ckv.prefix(n * (k.rank + k.rope));
    let op = MlaOp::Disassemble {
        dq,
        dkv,
        dckv,
        dqkv,
        n,
        dims: k,
    };
    engine::backend::moe_ops(be).mla(arena, &op);
    let (da, db) = state.dlatent.expect("latent gradients");
    let grad = |role| g.g(role).expect("a trained latent-attention weight");
    // The latent path: kv_b, the latent's norm, back into kv_a's output gradient.
    let (dn, dl) = (da.prefix(n * k.rank), db.prefix(n * k.rank));
    be.fill(arena, dn, 0.0);
    let kvb = (g.w(Role::MlaKvb), grad(Role::MlaKvb));
    g.dense(dn, dkv, must(a.kv_norm), kvb, None, (n, k.rank));
    norm_backward(
        g,
        (dl, dn),
        must(a.kv_latent),
        must(a.kv_rstd),
        Role::MlaKvNorm,
    );
    let back = MlaOp::Latent {
        latent: dl,
        ckv: dckv,
        n,
        dims: k,
        back: true,
    };
    engine::backend::moe_ops(be).mla(arena, &back);
    be.fill(arena, state.dln, 0.0);
    let dln = state.dln.prefix(n * c);
    let kva = (g.w(Role::MlaKva), grad(Role::MlaKva));
    g.dense(dln, dckv, a.ln1, kva, None, (n, c));
    match m.q_rank {
        Some(rq) => {
            let rq = rq as usize;
            let (dn, dl) = (da.prefix(n * rq), db.prefix(n * rq));
            be.fill(arena, dn, 0.0);
            let qb = (g.w(Role::MlaQb), grad(Role::MlaQb));
            g.dense(dn, dq, must(a.qa_norm), qb, None, (n, rq));
            norm_backward(g, (dl, dn), must(a.qa), must(a.qa_rstd), Role::MlaQaNorm);
            let qa = (g.w(Role::MlaQa), grad(Role::MlaQa));
            g.dense(dln, dl, a.ln1, qa, None, (n, c));
        }
        None => {
            let wq = (g.w(Role::MlaQ), grad(Role::MlaQ));
            g.dense(dln, dq, a.ln1, wq, None, (n, c));
        }
    }
    let saved = NormSaved {
        mean: a.ln1_mean,
        rstd: a.ln1_rstd,
    };
    let norm1 = (Role::Norm1Weight, Role::Norm1Bias);
    g.norm(dres, state.dln, inp, norm1, saved);
}

/// dinp := a latent norm's backward of `dout` (zeroed first), its weight gradient accumulated.
fn norm_backward<B: TrainOps>(
    g: &Grad<'_, B>,
    (dinp, dout): (Tensor, Tensor),
    inp: Tensor,
    rstd: Tensor,
    role: Role,
) {
    let n = g.n;
    g.be.fill(g.arena, dinp, 0.0);
    let op = NormBackward {
        dinp,
        dweight: g.g(role),
        dout,
        inp: inp.prefix(dinp.len),
        weight: g.w(role),
        rstd: rstd.prefix(n),
        kind: NormGradKind::Rms,
        n,
        c: dinp.len / n,
    };
    g.be.norm_backward(g.arena, &op);
}
