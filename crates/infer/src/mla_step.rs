//! Multi-head latent attention in an inference step (DeepSeek-V2), with a latent cache: per
//! token and layer the cache holds the normed latent (kv_rank) and the rotated RoPE key (rope)
//! — DeepSeek-V2's 512 + 64 values instead of 128 heads × (128 + 128 + 64) keys and values —
//! and attention absorbs the key/value expansion (kept in fp32) into the query and the output,
//! so nothing is expanded per cached token. The query and latent projections run in the weight
//! format through `qlinear`.
//!
//! Example: `step::run` calls `self.mla_attention(..)` in place of q|k|v, RoPE, the KV write and
//! paged attention, and gets the output projection in `proj`.

use super::{step_tensor, UnitWeights, Worker};
use engine::backend::ops::{NormKind, NormOp};
use engine::backend::InferOps;
use engine::backend::{LatentOp, MlaOp, QLinear, QMatrix, SeqRow, Tensor};
use plan_frugal::family::LATENT_NORM_EPS;
use plan_frugal::units::Role;
use plan_frugal::{StepAct, StepKind};

impl<B: InferOps> Worker<B> {
    /// proj (n, C) := latent attention's output projection for the step's rows (`ln` is the
    /// block's normed input; `atty` its scratch), writing each row's latent into `cache`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mla_attention(
        &self,
        kind: StepKind,
        w: &UnitWeights,
        cache: Tensor,
        (ln, atty, proj): (Tensor, Tensor, Tensor),
        positions: &[u32],
        slots: &[(u32, u32)],
        rows: &[SeqRow<'_>],
    ) {
        let (a, be) = (&self.arena, self.arena.backend());
        let s = &self.config.shape;
        let m = s.mla.as_ref().expect("latent attention");
        let n = positions.len();
        let c = s.d_model as usize;
        let shape = plan_frugal::ActShape { batch: 1, seq: 1 };
        let layer = plan_frugal::acts::BlockDims::layer(s, shape, 0);
        let d = engine::mla::kernel_dims(layer.mla.expect("latent attention"));
        let (hq, width) = (d.heads * d.qk(), d.rank + d.rope);
        let get = |t| step_tensor(a, kind, t).expect("a latent-attention step tensor");
        let (q, ckv, tmp) = (
            get(StepAct::Qkv),
            get(StepAct::Latent),
            get(StepAct::QLatent),
        );
        let rstd = get(StepAct::Rstd);
        let linear = |out: Tensor, inp: Tensor, weight: QMatrix| {
            let op = QLinear {
                out,
                inp,
                weight,
                bias: None,
                n,
            };
            be.qlinear(a, &op);
        };
        let norm = |inp: Tensor, out: Tensor, role: Role| {
            let width = inp.len / n;
            let op = NormOp {
                out: out.prefix(n * width),
                rstd: rstd.prefix(n),
                inp,
                weight: w.vector(role).expect("a latent norm"),
                kind: NormKind::Rms {
                    eps: LATENT_NORM_EPS,
                },
                n,
                c: width,
            };
            be.norm(a, &op);
        };
        let (q, ckv) = (q.prefix(n * hq), ckv.prefix(n * width));
        // `ln` is read no more once both projections have read it: it takes the normed latents.
        let normed = ln;
        let ln = ln.prefix(n * c);
        linear(ckv, ln, w.matrix(Role::MlaKva));
        match m.q_lora_rank {
            Some(rq) => {
                let qa = tmp.prefix(n * rq as usize);
                linear(qa, ln, w.matrix(Role::MlaQa));
                norm(qa, normed, Role::MlaQaNorm);
                linear(q, normed.prefix(qa.len), w.matrix(Role::MlaQb));
            }
            None => linear(q, ln, w.matrix(Role::MlaQ)),
        }
        let latent = tmp.prefix(n * d.rank);
        let take = |back| {
            let op = MlaOp::Latent {
                latent,
                ckv,
                n,
                dims: d,
                back,
            };
            engine::backend::moe_ops(be).mla(a, &op);
        };
        take(false);
        norm(latent, normed, Role::MlaKvNorm);
        let op = MlaOp::Latent {
            latent: normed.prefix(latent.len),
            ckv,
            n,
            dims: d,
            back: true,
        };
        engine::backend::moe_ops(be).mla(a, &op);
        let theta = self.config.rope_theta;
        let rope = |x: Tensor, row_width, heads, stride, offset| {
            let op = LatentOp::RopeAt {
                x,
                positions,
                row_width,
                heads,
                stride,
                offset,
                rope: d.rope,
                theta,
            };
            be.latent(a, &op);
        };
        rope(q, hq, d.heads, d.qk(), d.nope);
        rope(ckv, width, 1, width, d.rank);
        let block = self.setup.kv_block as usize;
        let write = LatentOp::Write {
            cache,
            ckv,
            slots,
            block,
        };
        be.latent(a, &write);
        let out = atty.prefix(n * d.heads * d.v);
        let op = LatentOp::Attention {
            out,
            q,
            cache,
            rows,
            block,
            w_kvb: w.vector(Role::MlaKvb).expect("kv_b in fp32"),
            dims: d,
            scale: 1.0 / (d.qk() as f32).sqrt(),
        };
        be.latent(a, &op);
        linear(proj.prefix(n * c), out, w.matrix(Role::AttnProjWeight));
    }
}
