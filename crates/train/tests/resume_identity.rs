//! A resume is refused when it would build another model: the identity a snapshot records is the
//! model's whole config (`ModelConfig::identity`), so changing any shape field, the numerics,
//! the routing or the LoRA settings is refused, naming the field.

use plan::model::SlidingWindow;
use plan::ModelShape;
use train::snapshot::state::TrainState;
use train::snapshot::RunState;
use train::testkit::{config, deepseek_tiny, llama_tiny, mixtral_tiny};
use train::{LoraConfig, TrainConfig};

/// The fields a resume of `base` would name when its config is changed by `change`.
fn refused(base: TrainConfig, change: impl Fn(&mut TrainConfig)) -> Vec<String> {
    let run = RunState {
        loader: data::LoaderPosition::default(),
        seed: 1,
        data: None,
    };
    let mut other = base.clone();
    change(&mut other);
    let snapshot = TrainState::of_config(&base, 3, &run);
    let this_run = TrainState::of_config(&other, 3, &run);
    snapshot
        .differences(&this_run)
        .into_iter()
        .map(|d| d.field)
        .collect()
}

fn of(shape: ModelShape) -> TrainConfig {
    config(shape, 1, 8)
}

fn windowed() -> ModelShape {
    ModelShape {
        sliding_window: Some(SlidingWindow {
            window: 4,
            first_layer: 0,
        }),
        ..llama_tiny()
    }
}

fn shape_of(c: &mut TrainConfig) -> &mut ModelShape {
    &mut c.model.shape
}

#[test]
fn the_same_config_resumes() {
    for shape in [llama_tiny(), mixtral_tiny(), deepseek_tiny(), windowed()] {
        assert!(refused(of(shape), |_| {}).is_empty());
    }
}

#[test]
fn a_changed_sliding_window_is_refused() {
    let f = refused(of(windowed()), |c| {
        shape_of(c).sliding_window.as_mut().unwrap().window = 8
    });
    assert_eq!(f, ["model.sliding_window.window"]);
    let f = refused(of(windowed()), |c| {
        shape_of(c).sliding_window.as_mut().unwrap().first_layer = 1
    });
    assert_eq!(f, ["model.sliding_window.first_layer"]);
    let f = refused(of(llama_tiny()), |c| {
        shape_of(c).sliding_window = windowed().sliding_window
    });
    assert_eq!(f, ["model.sliding_window"]);
    let f = refused(of(windowed()), |c| shape_of(c).sliding_window = None);
    assert_eq!(
        f,
        [
            "model.sliding_window.first_layer",
            "model.sliding_window.window"
        ]
    );
}

#[test]
fn changed_experts_top_k_or_routing_are_refused() {
    let f = refused(of(mixtral_tiny()), |c| {
        shape_of(c).moe.as_mut().unwrap().n_experts = 8
    });
    assert_eq!(f, ["model.moe.n_experts"]);
    let f = refused(of(mixtral_tiny()), |c| {
        shape_of(c).moe.as_mut().unwrap().n_active = 1
    });
    assert_eq!(f, ["model.moe.n_active"]);
    let f = refused(of(deepseek_tiny()), |c| {
        c.model.routing.gating = kernels::moe::Gating::Scaled(2.5)
    });
    assert_eq!(f, ["model.routing.gating.scaled"]);
    let f = refused(of(deepseek_tiny()), |c| {
        c.model.routing.groups = Some((2, 1))
    });
    assert_eq!(f, ["model.routing.groups"]);
    let f = refused(of(mixtral_tiny()), |c| c.model.router_aux_coef = 0.5);
    assert_eq!(f, ["model.router_aux_coef"]);
}

#[test]
fn changed_latent_attention_ranks_are_refused() {
    let f = refused(of(deepseek_tiny()), |c| {
        shape_of(c).mla.as_mut().unwrap().kv_lora_rank = 32
    });
    assert_eq!(f, ["model.mla.kv_lora_rank"]);
    let f = refused(of(deepseek_tiny()), |c| {
        shape_of(c).mla.as_mut().unwrap().q_lora_rank = None
    });
    assert_eq!(f, ["model.mla.q_lora_rank"]);
    // DeepSeek's first_k_dense_replace: how many leading layers keep a dense MLP.
    let f = refused(of(deepseek_tiny()), |c| {
        shape_of(c).moe.as_mut().unwrap().first_dense += 1
    });
    assert_eq!(f, ["model.moe.first_dense"]);
}

#[test]
fn changed_numerics_are_refused() {
    let f = refused(of(llama_tiny()), |c| c.model.rope_theta = 500_000.0);
    assert_eq!(f, ["model.rope_theta"]);
    let f = refused(of(llama_tiny()), |c| c.model.norm_eps = 1e-6);
    assert_eq!(f, ["model.norm_eps"]);
}

#[test]
fn changed_lora_settings_are_refused() {
    let lora = |rank| LoraConfig {
        plan: plan::setup::Lora {
            rank,
            targets: vec!["q_proj".into(), "v_proj".into()],
            base: plan::setup::Dtype::F32,
            double_quant: false,
            dropout: 0.0,
            ggml: None,
        },
        alpha: 16.0,
        base_weights: None,
    };
    let base = TrainConfig {
        lora: Some(lora(4)),
        ..of(llama_tiny())
    };
    let f = refused(base.clone(), |c| c.lora = Some(lora(8)));
    assert_eq!(f, ["run.lora.rank"]);
    // A LoRA snapshot resumed as a full run (no --lora-rank), and back: one difference.
    assert_eq!(refused(base.clone(), |c| c.lora = None), ["run.lora"]);
    assert_eq!(
        refused(of(llama_tiny()), |c| c.lora = Some(lora(4))),
        ["run.lora"]
    );
    let f = refused(base.clone(), |c| c.lora.as_mut().unwrap().alpha = 32.0);
    assert_eq!(f, ["run.lora.alpha"]);
    // Adapters trained over a random preset resumed over a saved base, and back.
    let saved = |c: &mut TrainConfig| c.lora.as_mut().unwrap().base_weights = Some(7);
    assert_eq!(refused(base.clone(), saved), ["run.lora.base_weights"]);
    let mut over_saved = base;
    saved(&mut over_saved);
    let f = refused(over_saved, |c| c.lora.as_mut().unwrap().base_weights = None);
    assert_eq!(f, ["run.lora.base_weights"]);
}

#[test]
fn an_older_snapshot_without_the_new_fields_still_resumes() {
    let run = RunState {
        loader: data::LoaderPosition::default(),
        seed: 1,
        data: None,
    };
    let c = of(mixtral_tiny());
    let mut old = TrainState::of_config(&c, 3, &run);
    // What earlier snapshots recorded: the dense shape and the numerics, no MoE, MLA, window
    // or routing fields.
    for field in ["moe", "mla", "sliding_window", "routing", "router_aux_coef"] {
        old.model.as_object_mut().unwrap().remove(field);
    }
    assert!(old
        .differences(&TrainState::of_config(&c, 3, &run))
        .is_empty());
}
