//! Mixtral: Llama attention (GQA, RoPE, RMSNorm, optionally Mistral's sliding window) with a
//! sparse mixture-of-experts MLP: a router (E, C) with no bias, then E SwiGLU experts of
//! `intermediate_size`, each token running its top k. The experts' gate|up projections are one
//! view, expert after expert, each expert's rows filled by HF's `w1` (gate) then `w3` (up), and
//! their down projections another, filled by each expert's `w2` — the names transformers writes
//! with `save_pretrained` (it fuses them into 3-D `gate_up_proj`/`down_proj` only in memory).
//!
//! Example: block 0's `Role::ExpertsFcWeight` rows 0..F are
//! `model.layers.0.block_sparse_moe.experts.0.w1.weight`.

use super::llama::Llama;
use super::{Arch, BlockDesign};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};

pub struct Mixtral;

impl Arch for Mixtral {
    fn design(&self) -> BlockDesign {
        BlockDesign {
            moe: true,
            ..Llama.design()
        }
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        Llama.check(m)?;
        let moe = m.moe.as_ref().ok_or_else(|| PlanError::Invalid {
            field: "num_local_experts".into(),
            reason: "a Mixtral model needs its experts".into(),
        })?;
        if moe.n_shared != 0 || moe.first_dense != 0 || moe.router_bias {
            return Err(PlanError::Invalid {
                field: "n_shared_experts".into(),
                reason: "Mixtral has no shared experts, dense layers or router bias".into(),
            });
        }
        Ok(())
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.embed(m, u)
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        let moe = m.moe.as_ref().expect("checked: Mixtral has experts");
        let (c, f, e) = (m.d_model, moe.d_ff_expert, moe.n_experts);
        // Llama's attention half, then the router and the experts instead of its MLP.
        let mut base = UnitBuilder::scratch();
        Llama.block(m, layer, &mut base);
        for (role, shape, parts) in base.into_views() {
            if matches!(role, Role::FcWeight | Role::FcProjWeight) {
                continue;
            }
            u.view(role, &shape, &parts);
        }
        let p = |s: &str| format!("model.layers.{layer}.block_sparse_moe.{s}");
        u.one(Role::RouterWeight, &[e.into(), c], &p("gate.weight"), false);
        let gate_up: Vec<_> = (0..e)
            .flat_map(|x| {
                [
                    (p(&format!("experts.{x}.w1.weight")), f, false),
                    (p(&format!("experts.{x}.w3.weight")), f, false),
                ]
            })
            .collect();
        u.view(Role::ExpertsFcWeight, &[u64::from(e) * 2 * f, c], &gate_up);
        let down: Vec<_> = (0..e)
            .map(|x| (p(&format!("experts.{x}.w2.weight")), c, false))
            .collect();
        u.view(Role::ExpertsProjWeight, &[u64::from(e) * c, f], &down);
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.head(m, u)
    }
}
