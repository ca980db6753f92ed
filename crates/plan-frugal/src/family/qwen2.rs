//! Qwen2 (and Qwen2.5): Llama blocks with biases on the q, k and v projections (and none
//! elsewhere), tied embeddings at the small sizes. The fused q|k|v bias is one view filled by the
//! three HF bias tensors, as the weight is.
//!
//! Example: block 0's `Role::QkvBias` is `model.layers.0.self_attn.{q,k,v}_proj.bias`.

use super::llama::Llama;
use super::{Arch, BlockDesign};
use crate::units::{Role, UnitBuilder};
use plan::{ModelShape, PlanError};

pub struct Qwen2;

impl Arch for Qwen2 {
    fn design(&self) -> BlockDesign {
        Llama.design()
    }

    fn check(&self, m: &ModelShape) -> Result<(), PlanError> {
        Llama.check(m)
    }

    fn embed(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.embed(m, u)
    }

    fn block(&self, m: &ModelShape, layer: u32, u: &mut UnitBuilder) {
        // Llama's views with the q|k|v bias right after the q|k|v weight.
        let mut base = UnitBuilder::scratch();
        Llama.block(m, layer, &mut base);
        let q_rows = u64::from(m.n_heads) * m.d_head;
        let kv_rows = u64::from(m.n_kv_heads) * m.d_head;
        let p = |s: &str| format!("model.layers.{layer}.self_attn.{s}");
        for v in base.into_views() {
            let (role, shape, parts) = v;
            u.view(role, &shape, &parts);
            if role == Role::QkvWeight {
                let bias = [
                    (p("q_proj.bias"), q_rows, false),
                    (p("k_proj.bias"), kv_rows, false),
                    (p("v_proj.bias"), kv_rows, false),
                ];
                u.view(Role::QkvBias, &[q_rows + 2 * kv_rows], &bias);
            }
        }
    }

    fn head(&self, m: &ModelShape, u: &mut UnitBuilder) {
        Llama.head(m, u)
    }
}
