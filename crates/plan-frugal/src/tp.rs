//! Tensor parallelism (Megatron-LM): what one of `tp` ranks holds of a model, and how its
//! weights map onto the whole model's.
//!
//! Attention is split by heads: each rank holds the q, k and v rows of `n_heads / tp` query and
//! `n_kv_heads / tp` key/value heads (column-parallel) and the matching columns of the output
//! projection (row-parallel); the MLP holds `d_ff / tp` of the up (gate and up for SwiGLU) rows
//! and the down projection's columns. The token embedding and an untied head are split by
//! vocabulary rows (vocab-parallel; the first `vocab % tp` ranks take one row more, so no padding
//! row ever joins the softmax). Norms, learned positions and the row-parallel biases are whole on
//! every rank (replicated): their gradients come out the same on every rank.
//!
//! A rank's share is itself a model shape ([`rank_shape`]: fewer heads, a narrower MLP, its
//! vocabulary slice), so the units, activations and the plan of one rank are the single-rank
//! plan of that shape; [`split`] says where each of its views sits in the whole model's view,
//! and [`take`]/[`put`] copy between the two (initialisation, loading and saving go through the
//! whole model).
//!
//! Example: GPT-2 124M at `tp = 2`: each rank's block holds 6 heads' q|k|v rows (1152 × 768) and
//! a 768 × 384 slice of `c_proj`; its embedding holds tokens 0..25129 or 25129..50257.

use super::family::{arch, Mlp};
use super::units::{build_units, check_buildable, Role, Unit};
use plan::model::Moe;
use plan::{ModelShape, PlanError};

/// Where one rank's view sits in the whole model's view of the same role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// Replicated: the whole view on every rank.
    Whole,
    /// Row ranges `(first, rows)` of the whole view, one after another in the rank's view
    /// (column-parallel weights and their biases; a vocabulary slice).
    Rows(Vec<(u64, u64)>),
    /// Columns `first..first + cols` of every row (row-parallel weights).
    Cols(u64, u64),
}

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

/// Refuses a model `tp` ranks cannot split, naming the numbers: heads, key/value heads, the MLP
/// width and an expert's must divide by `tp`, the vocabulary hold at least one row per rank.
pub fn check(model: &ModelShape, tp: u32) -> Result<(), PlanError> {
    if tp == 0 {
        return Err(invalid("--tp", "at least one tensor-parallel rank".into()));
    }
    if tp == 1 {
        return Ok(());
    }
    let heads = model.n_heads;
    if heads % tp != 0 {
        let reason = format!("{heads} attention heads do not split over --tp {tp}");
        return Err(invalid("--tp", reason));
    }
    if let Some(e) = model
        .moe
        .as_ref()
        .filter(|e| e.d_ff_expert % u64::from(tp) != 0)
    {
        let reason = format!(
            "each expert's MLP width {} does not split over --tp {tp}",
            e.d_ff_expert
        );
        return Err(invalid("--tp", reason));
    }
    // Fewer key/value heads than ranks: each is replicated on the tp / n_kv ranks whose query
    // heads read it (Megatron's GQA with TP > groups). Latent attention caches one latent per
    // token for all heads, which every rank holds whole.
    let kv = model.n_kv_heads;
    if model.mla.is_none() && ((kv >= tp && kv % tp != 0) || (kv < tp && tp % kv != 0)) {
        let reason = format!(
            "{kv} key/value heads neither split over --tp {tp} nor replicate evenly on it (use a \
             --tp that divides {kv} or that {kv} divides)"
        );
        return Err(invalid("--tp", reason));
    }
    if model.d_ff % u64::from(tp) != 0 {
        let reason = format!("the MLP width {} does not split over --tp {tp}", model.d_ff);
        return Err(invalid("--tp", reason));
    }
    if model.vocab < u64::from(tp) {
        let reason = format!("a vocabulary of {} is smaller than --tp {tp}", model.vocab);
        return Err(invalid("--tp", reason));
    }
    Ok(())
}

/// Refuses quantization groups (`group` weights along a row) that a row-parallel slice (the
/// attention output's and the MLP down projection's columns) would cut: each rank quantizes its
/// own slice, and its groups must be the whole model's groups for the values to be the same.
pub fn check_groups(model: &ModelShape, tp: u32, group: Option<u64>) -> Result<(), PlanError> {
    let Some(group) = group.filter(|_| tp > 1) else {
        return Ok(());
    };
    let t = u64::from(tp);
    let attn = u64::from(model.n_heads) * attention_width(model) / t;
    let experts = (model.moe.as_ref()).map(|e| ("experts' down projections", e.d_ff_expert / t));
    for (what, cols) in [
        ("attention output", attn),
        ("MLP down projection", model.d_ff / t),
    ]
    .into_iter()
    .chain(experts)
    {
        if cols % group != 0 {
            let reason = format!(
                "each rank holds {cols} input columns of the {what}, not a whole number of \
                 --weight-group {group} groups (use a group that divides {cols}, or another --tp)"
            );
            return Err(invalid("--tp", reason));
        }
    }
    Ok(())
}

/// The vocabulary rows `(first, rows)` rank `rank` of `tp` holds: the first `vocab % tp` ranks
/// take one row more.
pub fn vocab_range(vocab: u64, tp: u32, rank: u32) -> (u64, u64) {
    let (tp, rank) = (u64::from(tp), u64::from(rank));
    let (base, extra) = (vocab / tp, vocab % tp);
    let first = rank * base + rank.min(extra);
    (first, base + u64::from(rank < extra))
}

/// Ranks that share one key/value head (1 when the heads split over the ranks).
pub fn kv_replicas(model: &ModelShape, tp: u32) -> u32 {
    (tp / model.n_kv_heads).max(1)
}

/// The model shape rank `rank` of `tp` computes with (after [`check`]).
pub fn rank_shape(model: &ModelShape, tp: u32, rank: u32) -> ModelShape {
    ModelShape {
        n_heads: model.n_heads / tp,
        n_kv_heads: (model.n_kv_heads / tp).max(1),
        d_ff: model.d_ff / u64::from(tp),
        vocab: vocab_range(model.vocab, tp, rank).1,
        moe: model.moe.clone().map(|e| Moe {
            d_ff_expert: e.d_ff_expert / u64::from(tp),
            ..e
        }),
        ..model.clone()
    }
}

/// Values per head the attention output projection reads: `d_head`, or latent attention's value
/// width.
fn attention_width(model: &ModelShape) -> u64 {
    model.mla.as_ref().map_or(model.d_head, |a| a.v_head_dim)
}

/// The parameter units of rank `rank` of `tp` (padded for `world` data-parallel ranks).
pub fn units(model: &ModelShape, tp: u32, rank: u32, world: u32) -> Result<Vec<Unit>, PlanError> {
    check_buildable(model)?;
    check(model, tp)?;
    build_units(&rank_shape(model, tp, rank), world)
}

/// Where rank `rank`'s view of `role` sits in the whole model's.
///
/// Latent attention splits by heads what is per head (the query expansion, the key/value
/// expansion, the output projection's columns) and replicates the latent's own projections and
/// norms. A mixture of experts splits every expert's MLP as a dense one (its gate and up rows,
/// its down projection's columns) and replicates the router, so every rank routes each token
/// alike; the shared experts are one dense MLP.
pub fn split(model: &ModelShape, role: Role, tp: u32, rank: u32) -> Split {
    if tp == 1 {
        return Split::Whole;
    }
    let (t, r) = (u64::from(tp), u64::from(rank));
    let (q, kv) = (
        u64::from(model.n_heads) * model.d_head,
        u64::from(model.n_kv_heads) * model.d_head,
    );
    let f = model.d_ff;
    let swiglu = arch(model).is_ok_and(|a| a.design().mlp == Mlp::SwiGlu);
    // `per_head` rows apiece for this rank's heads.
    let heads = |per_head: u64| {
        let h = u64::from(model.n_heads) / t * per_head;
        Split::Rows(vec![(r * h, h)])
    };
    // Each of `n` stacked gate|up blocks of width `w`: this rank's gate rows, then its up rows.
    let gate_up = |n: u64, w: u64| {
        let share = w / t;
        let rows = (0..n).flat_map(|e| {
            [
                (e * 2 * w + r * share, share),
                (e * 2 * w + w + r * share, share),
            ]
        });
        Split::Rows(rows.collect())
    };
    let (experts, expert, shared) = model.moe.as_ref().map_or((0, 0, 0), |e| {
        let n_shared = u64::from(e.n_shared) * e.d_ff_expert;
        (u64::from(e.n_experts), e.d_ff_expert, n_shared)
    });
    let mla = model.mla.as_ref();
    match role {
        Role::MlaQ | Role::MlaQb => {
            let a = mla.expect("a latent-attention view");
            heads(a.qk_nope_head_dim + a.qk_rope_head_dim)
        }
        Role::MlaKvb => {
            let a = mla.expect("a latent-attention view");
            heads(a.qk_nope_head_dim + a.v_head_dim)
        }
        Role::MlaQa | Role::MlaQaNorm | Role::MlaKva | Role::MlaKvNorm | Role::RouterWeight => {
            Split::Whole
        }
        Role::AttnProjWeight if mla.is_some() => {
            let v = u64::from(model.n_heads) * attention_width(model);
            Split::Cols(r * v / t, v / t)
        }
        Role::ExpertsFcWeight => gate_up(experts, expert),
        Role::ExpertsProjWeight => Split::Cols(r * expert / t, expert / t),
        Role::SharedFcWeight => gate_up(1, shared),
        Role::SharedProjWeight => Split::Cols(r * shared / t, shared / t),
        Role::TokenEmbedding | Role::LmHead => {
            Split::Rows(vec![vocab_range(model.vocab, tp, rank)])
        }
        Role::QkvWeight | Role::QkvBias => {
            // This rank's key/value heads: its slice, or the one its query heads share.
            let (first, rows) = match kv_replicas(model, tp) {
                1 => (r * kv / t, kv / t),
                shared => ((r / u64::from(shared)) * model.d_head, model.d_head),
            };
            Split::Rows(vec![
                (r * q / t, q / t),
                (q + first, rows),
                (q + kv + first, rows),
            ])
        }
        Role::AttnProjWeight => Split::Cols(r * q / t, q / t),
        Role::FcWeight | Role::FcBias if swiglu => {
            Split::Rows(vec![(r * f / t, f / t), (f + r * f / t, f / t)])
        }
        Role::FcWeight | Role::FcBias => Split::Rows(vec![(r * f / t, f / t)]),
        Role::FcProjWeight => Split::Cols(r * f / t, f / t),
        Role::PositionEmbedding
        | Role::Norm1Weight
        | Role::Norm1Bias
        | Role::Norm2Weight
        | Role::Norm2Bias
        | Role::AttnProjBias
        | Role::FcProjBias
        | Role::FinalNormWeight
        | Role::FinalNormBias => Split::Whole,
        other => {
            panic!("{other:?} has no tensor-parallel split (LoRA under TP is refused at set-up)")
        }
    }
}

/// Copies rank's part (`split`) of the whole view `whole` (shape `[rows, cols]` or `[n]`) into
/// `part`.
pub fn take(split: &Split, whole_shape: &[u64], whole: &[f32], part: &mut [f32]) {
    copy(split, whole_shape, part.len(), |w, p, n| {
        part[p..p + n].copy_from_slice(&whole[w..w + n])
    });
}

/// Writes `part`, a rank's view, into its place (`split`) in the whole view `whole`.
pub fn put(split: &Split, whole_shape: &[u64], part: &[f32], whole: &mut [f32]) {
    copy(split, whole_shape, part.len(), |w, p, n| {
        whole[w..w + n].copy_from_slice(&part[p..p + n])
    });
}

/// Calls `run(whole_offset, part_offset, len)` for each contiguous run the split copies.
fn copy(
    split: &Split,
    whole_shape: &[u64],
    part_len: usize,
    mut run: impl FnMut(usize, usize, usize),
) {
    let cols = whole_shape.get(1).copied().unwrap_or(1) as usize;
    let rows = whole_shape[0] as usize;
    match split {
        Split::Whole => {
            assert_eq!(part_len, rows * cols, "a replicated view is whole");
            run(0, 0, part_len);
        }
        Split::Rows(ranges) => {
            let mut at = 0;
            for &(first, n) in ranges {
                let (first, n) = (first as usize, n as usize);
                assert!(first + n <= rows, "rows {first}+{n} past {rows}");
                run(first * cols, at, n * cols);
                at += n * cols;
            }
            assert_eq!(at, part_len, "the row ranges fill the rank's view");
        }
        &Split::Cols(first, n) => {
            let (first, n) = (first as usize, n as usize);
            assert!(
                first + n <= cols && part_len == rows * n,
                "columns {first}+{n} of {cols}"
            );
            for row in 0..rows {
                run(row * cols + first, row * n, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{build_units, param_units};
    use plan::presets;

    #[test]
    fn vocabulary_slices_cover_every_id_once() {
        for (v, tp) in [(50257, 2), (50257, 4), (7, 3), (8, 8)] {
            let mut next = 0;
            for r in 0..tp {
                let (first, n) = vocab_range(v, tp, r);
                assert_eq!(first, next);
                next += n;
            }
            assert_eq!(next, v);
        }
    }

    #[test]
    fn every_rank_holds_its_share_and_the_shares_rebuild_the_whole_model() {
        // llama-tiny at 4: its 2 key/value heads each replicated on 2 ranks.
        let cases = [
            ("gpt2-tiny", 2),
            ("llama-tiny", 2),
            ("gpt2-tiny", 4),
            ("llama-tiny", 4),
            ("mixtral-tiny", 2),
            ("deepseek-tiny", 2),
            ("deepseek-tiny", 4),
        ];
        for (name, tp) in cases {
            let model = presets::by_name(name).unwrap();
            check(&model, tp).unwrap();
            let whole = param_units(&model, 1).unwrap();
            // The whole model's values: each element its own index.
            let values: Vec<Vec<f32>> = (whole.iter())
                .map(|u| (0..u.numel).map(|i| i as f32).collect())
                .collect();
            let mut rebuilt: Vec<Vec<f32>> =
                whole.iter().map(|u| vec![-1.0; u.numel as usize]).collect();
            let mut block_numel = 0;
            for r in 0..tp {
                let units = build_units(&rank_shape(&model, tp, r), 1).unwrap();
                block_numel += units[1].numel;
                for (u, unit) in units.iter().enumerate() {
                    for view in &unit.views {
                        let wv = whole[u].view(view.role);
                        let w = &values[u][wv.offset as usize..][..wv.numel() as usize];
                        let mut part = vec![0.0; view.numel() as usize];
                        let s = split(&model, view.role, tp, r);
                        take(&s, &wv.shape, w, &mut part);
                        let dst = &mut rebuilt[u][wv.offset as usize..][..wv.numel() as usize];
                        put(&s, &wv.shape, &part, dst);
                    }
                }
            }
            assert_eq!(rebuilt, values, "{name} tp {tp}");
            // Block matrices split exactly; the replicated vectors are counted once per rank, a
            // replicated key/value head once per rank sharing it.
            let vectors: u64 = (whole[1].views.iter())
                .filter(|v| split(&model, v.role, tp, 0) == Split::Whole)
                .map(|v| v.numel())
                .sum();
            let shared = u64::from(kv_replicas(&model, tp));
            let kv = 2
                * u64::from(model.n_kv_heads)
                * model.d_head
                * (model.d_model + u64::from(whole[1].has(Role::QkvBias)));
            assert_eq!(
                block_numel - u64::from(tp - 1) * vectors - (shared - 1) * kv,
                whole[1].numel,
                "{name}"
            );
        }
    }

    #[test]
    fn shapes_that_do_not_split_are_refused_naming_the_numbers() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        let heads = check(&model, 3).unwrap_err().to_string();
        assert!(
            heads.contains("heads") && heads.contains("--tp 3"),
            "{heads}"
        );
        let llama = presets::by_name("llama-tiny").unwrap();
        let gqa = ModelShape {
            n_kv_heads: 1,
            ..llama.clone()
        };
        // One key/value head replicates on both ranks; three neither split nor replicate on 2.
        check(&gqa, 2).unwrap();
        let odd = ModelShape {
            n_heads: 6,
            n_kv_heads: 3,
            ..gqa.clone()
        };
        let kv = check(&odd, 2).unwrap_err().to_string();
        assert!(kv.contains("3 key/value heads"), "{kv}");
        let narrow = ModelShape { d_ff: 177, ..llama };
        assert!(check(&narrow, 2)
            .unwrap_err()
            .to_string()
            .contains("MLP width"));
        let moe = presets::by_name("mixtral-tiny").unwrap();
        check(&moe, 2).unwrap();
        let wide = ModelShape {
            moe: moe.moe.clone().map(|e| plan::model::Moe {
                d_ff_expert: 97,
                ..e
            }),
            ..moe
        };
        let err = check(&wide, 2).unwrap_err().to_string();
        assert!(err.contains("expert's MLP width 97"), "{err}");
    }
}

#[cfg(test)]
mod sp_tests {
    use crate::acts::BlockTensor;
    use crate::{training_plan, Key};
    use plan::presets;
    use plan::setup::{Attention, Precision, TrainSetup};
    use plan::MemoryPlan;

    fn bytes(plan: &MemoryPlan, key: Key) -> u64 {
        plan.buffers
            .iter()
            .find(|b| b.key == Some(key))
            .map_or(0, |b| b.bytes)
    }

    #[test]
    fn tp_splits_the_tp_regions_and_sp_the_norms_region_as_korthikanti() {
        let model = presets::by_name("gpt2-124m").unwrap();
        let base = TrainSetup {
            precision: Precision::Fp32,
            attention: Attention::Eager,
            ..TrainSetup::new(4, 256)
        };
        let one = training_plan(&model, &base).unwrap();
        let tp = training_plan(
            &model,
            &TrainSetup {
                tp: 2,
                ..base.clone()
            },
        )
        .unwrap();
        let sp = training_plan(
            &model,
            &TrainSetup {
                tp: 2,
                sp: true,
                ..base
            },
        )
        .unwrap();
        for t in [
            BlockTensor::Qkv,
            BlockTensor::Att,
            BlockTensor::Atty,
            BlockTensor::Fch,
            BlockTensor::FchAct,
        ] {
            let key = Key::Act(3, t);
            assert_eq!(2 * bytes(&tp, key), bytes(&one, key), "{t:?} /TP");
            assert_eq!(bytes(&sp, key), bytes(&tp, key), "{t:?} stays /TP");
        }
        for t in [
            BlockTensor::Ln1,
            BlockTensor::Ln1Mean,
            BlockTensor::Ln1Rstd,
            BlockTensor::Res2,
            BlockTensor::Ln2,
        ] {
            let key = Key::Act(3, t);
            assert_eq!(bytes(&tp, key), bytes(&one, key), "{t:?} whole under TP");
            assert_eq!(2 * bytes(&sp, key), bytes(&one, key), "{t:?} /TP under SP");
        }
        for key in [Key::BlockOut(3), Key::Encoded, Key::DResidual] {
            assert_eq!(2 * bytes(&sp, key), bytes(&tp, key), "{key} /TP under SP");
        }
    }
}
