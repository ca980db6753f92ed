//! Mixed precision pieces against their definitions: both loss scalers' exact schedules, a forced
//! overflow that skips the step everywhere (two ranks over the in-process communicator), the
//! scaler's state through JSON, and the fp32-master AdamW step bit for bit against
//! `kernels::adamw::update`.

use comm::{Collective, InProcess};
use half::{bf16, f16};
use kernels::adamw::{self, AdamW};
use train::precision::{
    adamw_master_step, unscale_and_check, DeepSpeedScaling, Grads, LossScaler, MasterStep,
    PrecisionError, ScalerConfig, ScalerState, StepDecision, TorchScaling, Working,
};

fn run(scaler: &mut LossScaler, overflows: &[bool]) -> Vec<StepDecision> {
    overflows
        .iter()
        .map(|&o| scaler.update(o).unwrap())
        .collect()
}

#[test]
fn torch_grows_after_2000_clean_steps_and_halves_on_overflow() {
    let mut s = LossScaler::torch();
    assert_eq!((s.scale(), s.inv_scale()), (65536.0, 1.0 / 65536.0));
    run(&mut s, &[false; 1999]);
    assert_eq!((s.scale(), s.state().growth_tracker), (65536.0, 1999));
    assert_eq!(s.update(false).unwrap(), StepDecision::Apply);
    assert_eq!((s.scale(), s.state().growth_tracker), (131072.0, 0));
    run(&mut s, &[false; 500]);
    assert_eq!(s.update(true).unwrap(), StepDecision::Skip);
    assert_eq!((s.scale(), s.state().growth_tracker), (65536.0, 0));
    // Consecutive overflows halve every time (no hysteresis in torch).
    run(&mut s, &[true, true]);
    assert_eq!((s.scale(), s.state().skipped_steps), (16384.0, 3));
    // The growth tracker restarted at the overflow: 2000 more clean steps to grow.
    run(&mut s, &[false; 1999]);
    assert_eq!(s.scale(), 16384.0);
    run(&mut s, &[false]);
    assert_eq!(s.scale(), 32768.0);
}

#[test]
fn torch_keeps_the_scale_when_growing_would_overflow_f32_and_stops_at_the_floor() {
    let config = TorchScaling {
        init_scale: 2f32.powi(127),
        growth_interval: 1,
        ..TorchScaling::default()
    };
    let mut s = LossScaler::new(ScalerConfig::Torch(config)).unwrap();
    run(&mut s, &[false; 3]);
    assert_eq!(s.scale(), 2f32.powi(127));
    let floor = TorchScaling {
        init_scale: f32::MIN_POSITIVE * 2.0,
        ..TorchScaling::default()
    };
    let mut s = LossScaler::new(ScalerConfig::Torch(floor)).unwrap();
    run(&mut s, &[true]);
    assert_eq!(s.scale(), f32::MIN_POSITIVE);
    let err = s.update(true).unwrap_err();
    assert!(matches!(
        err,
        PrecisionError::ScaleAtMinimum {
            scaler: "torch",
            ..
        }
    ));
}

#[test]
fn deepspeed_hysteresis_window_and_growth_follow_loss_scaler_py() {
    let mut s = LossScaler::deepspeed();
    assert_eq!(s.scale(), 65536.0);
    // 1000 clean updates (iters 0..=999): (999 - (-1)) % 1000 == 0 doubles at the last one.
    run(&mut s, &[false; 999]);
    assert_eq!(s.scale(), 65536.0);
    run(&mut s, &[false]);
    assert_eq!(s.scale(), 131072.0);
    // First overflow spends hysteresis (2 -> 1) and keeps the scale; the step is still skipped.
    assert_eq!(s.update(true).unwrap(), StepDecision::Skip);
    assert_eq!((s.scale(), s.state().hysteresis_left), (131072.0, 1));
    // A clean step does not restore hysteresis (consecutive_hysteresis is false) ...
    run(&mut s, &[false]);
    assert_eq!(s.state().hysteresis_left, 1);
    // ... so the next overflow, not consecutive, halves.
    run(&mut s, &[true]);
    assert_eq!((s.scale(), s.state().hysteresis_left), (65536.0, 1));
    run(&mut s, &[true]);
    assert_eq!(s.scale(), 32768.0);
    // Last overflow at iter 1003: growth (and hysteresis back to 2) at iter 2003.
    assert_eq!(s.state().last_overflow_iter, 1003);
    run(&mut s, &[false; 999]);
    assert_eq!((s.scale(), s.state().hysteresis_left), (32768.0, 1));
    run(&mut s, &[false]);
    assert_eq!((s.scale(), s.state().hysteresis_left), (65536.0, 2));
    assert_eq!(s.state().skipped_steps, 3);
}

#[test]
fn deepspeed_consecutive_hysteresis_restores_on_every_clean_step() {
    let config = DeepSpeedScaling {
        consecutive_hysteresis: true,
        ..DeepSpeedScaling::default()
    };
    let mut s = LossScaler::new(ScalerConfig::DeepSpeed(config)).unwrap();
    run(&mut s, &[true, false, true, false, true]);
    assert_eq!((s.scale(), s.state().hysteresis_left), (65536.0, 1));
    run(&mut s, &[true]);
    assert_eq!(s.scale(), 32768.0);
}

#[test]
fn deepspeed_fails_loudly_at_the_minimum_scale() {
    let config = DeepSpeedScaling {
        initial_scale_power: 2,
        ..DeepSpeedScaling::default()
    };
    let mut s = LossScaler::new(ScalerConfig::DeepSpeed(config)).unwrap();
    // 4 -(hysteresis)-> 4 -> 2 -> 1, then an overflow at the minimum is the error.
    run(&mut s, &[true, true, true]);
    assert_eq!(s.scale(), 1.0);
    let err = s.update(true).unwrap_err();
    assert_eq!(
        err,
        PrecisionError::ScaleAtMinimum {
            scaler: "deepspeed",
            scale: 1.0,
            update: 3
        }
    );
    assert!(err.to_string().contains("loss scale already at minimum"));
    // The halving clamps at the minimum rather than going below it.
    let config = DeepSpeedScaling {
        initial_scale_power: 2,
        hysteresis: 1,
        min_loss_scale: 3.0,
        ..DeepSpeedScaling::default()
    };
    let mut s = LossScaler::new(ScalerConfig::DeepSpeed(config)).unwrap();
    run(&mut s, &[true]);
    assert_eq!(s.scale(), 3.0);
    assert!(s.update(true).is_err());
}

#[test]
fn bad_settings_are_refused_by_name() {
    let zero_window = DeepSpeedScaling {
        loss_scale_window: 0,
        ..DeepSpeedScaling::default()
    };
    let err = LossScaler::new(ScalerConfig::DeepSpeed(zero_window)).unwrap_err();
    assert!(matches!(
        err,
        PrecisionError::InvalidScaler {
            field: "loss_scale_window",
            ..
        }
    ));
    let shrink = TorchScaling {
        growth_factor: 0.5,
        ..TorchScaling::default()
    };
    assert!(LossScaler::new(ScalerConfig::Torch(shrink)).is_err());
    let state = ScalerState {
        scale: 0.0,
        ..*LossScaler::torch().state()
    };
    let err = LossScaler::restore(*LossScaler::torch().config(), state).unwrap_err();
    assert!(matches!(
        err,
        PrecisionError::InvalidScaler { field: "scale", .. }
    ));
}

#[test]
fn state_survives_json_and_resumes_identically() {
    let pattern: Vec<bool> = (0..3000).map(|i| i % 397 == 5 || i % 1013 == 7).collect();
    for mut original in [LossScaler::torch(), LossScaler::deepspeed()] {
        run(&mut original, &pattern[..1234]);
        let config = serde_json::to_string(original.config()).unwrap();
        let state = serde_json::to_string(original.state()).unwrap();
        let mut resumed = LossScaler::restore(
            serde_json::from_str(&config).unwrap(),
            serde_json::from_str(&state).unwrap(),
        )
        .unwrap();
        assert_eq!(resumed, original);
        let a = run(&mut original, &pattern[1234..]);
        let b = run(&mut resumed, &pattern[1234..]);
        assert_eq!((a, original.state()), (b, resumed.state()));
    }
}

/// A rank's optimizer state: fp32 master weights, AdamW's moments, the fp16 working copy.
struct RankState {
    master: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    working: Vec<f16>,
}

/// One rank's fp16-style step: unscale, agree on overflow over all ranks, update or skip.
fn rank_step(
    comm: &mut dyn Collective,
    scaler: &mut LossScaler,
    grads: &mut [f32],
    st: &mut RankState,
) -> StepDecision {
    let RankState {
        master,
        m,
        v,
        working,
    } = st;
    let local = unscale_and_check(grads, scaler.inv_scale());
    let global = comm.any(local).unwrap();
    let decision = scaler.update(global).unwrap();
    if decision == StepDecision::Apply {
        let step = MasterStep {
            opt: AdamW::default(),
            step: 1,
            grad_multiplier: 1.0,
        };
        adamw_master_step(
            master,
            m,
            v,
            Grads::F32(grads),
            Some(Working::F16(working)),
            step,
        );
    }
    decision
}

#[test]
fn an_overflow_on_one_rank_skips_the_step_on_every_rank() {
    let ranks = InProcess::world(2).unwrap();
    let results = std::thread::scope(|scope| {
        let joins: Vec<_> = ranks
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let n = 5000;
                    let mut scaler = LossScaler::torch();
                    let master: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
                    let (m, v) = (vec![0.0f32; n], vec![0.0f32; n]);
                    let working: Vec<f16> = master.iter().map(|&x| f16::from_f32(x)).collect();
                    let mut st = RankState {
                        master,
                        m,
                        v,
                        working,
                    };
                    let (before, working_before) = (st.master.clone(), st.working.clone());
                    // Scaled gradients: rank 0 overflowed in one element.
                    let mut grads = vec![1000.0f32; n];
                    if comm.rank() == 0 {
                        grads[4321] = f32::INFINITY;
                    }
                    let d = rank_step(&mut comm, &mut scaler, &mut grads, &mut st);
                    let untouched = st.master == before
                        && st.working == working_before
                        && st.m.iter().chain(&st.v).all(|&x| x == 0.0);
                    // The next step is clean everywhere: both ranks apply it.
                    let mut grads = vec![1000.0f32; n];
                    let d2 = rank_step(&mut comm, &mut scaler, &mut grads, &mut st);
                    (d, untouched, d2, st.master != before, *scaler.state())
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (rank, (d, untouched, d2, moved, state)) in results.iter().enumerate() {
        assert_eq!(*d, StepDecision::Skip, "rank {rank} skips");
        assert!(
            *untouched,
            "rank {rank}: weights, working copy and moments untouched"
        );
        assert_eq!(state.scale, 32768.0, "rank {rank}: the scale halved");
        assert_eq!(state.skipped_steps, 1);
        assert_eq!(*d2, StepDecision::Apply);
        assert!(*moved, "rank {rank} applied the clean step");
    }
    assert_eq!(results[0].4, results[1].4, "both scalers stay identical");
}

fn vec_of(n: usize, seed: u32) -> Vec<f32> {
    train::testkit::values(n, u64::from(seed), 0.02)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn master_step_equals_kernels_adamw_bit_for_bit() {
    // Spans several rayon chunks and ends mid-block.
    let n = 3 * (1 << 14) + 1000 + 7;
    let opt = AdamW::new(3e-3, (0.8, 0.95), 1e-6, 0.1);
    let init = vec_of(n, 1);
    let (mut p_ref, mut m_ref, mut v_ref) = (init.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let (mut p, mut m, mut v) = (init.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let mut working = vec![bf16::ZERO; n];
    let inv_scale = 1.0 / 1024.0;
    for step in 1..=5u32 {
        let scaled: Vec<f32> = vec_of(n, 10 + step).iter().map(|g| g * 1024.0).collect();
        // Reference: unscale in place, then the kernel.
        let mut g_ref = scaled.clone();
        assert!(!unscale_and_check(&mut g_ref, inv_scale));
        adamw::update(&mut p_ref, &g_ref, &mut m_ref, &mut v_ref, opt, step);
        // Fused: unscale inside the step, write the bf16 working copy.
        let s = MasterStep {
            opt,
            step,
            grad_multiplier: inv_scale,
        };
        adamw_master_step(
            &mut p,
            &mut m,
            &mut v,
            Grads::F32(&scaled),
            Some(Working::Bf16(&mut working)),
            s,
        );
        assert_eq!(bits(&p), bits(&p_ref), "master, step {step}");
        assert_eq!(
            (bits(&m), bits(&v)),
            (bits(&m_ref), bits(&v_ref)),
            "moments, step {step}"
        );
        let want: Vec<bf16> = p.iter().map(|&x| bf16::from_f32(x)).collect();
        assert!(working
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn two_byte_gradients_equal_widening_then_the_kernel() {
    let n = 20_000;
    let opt = AdamW::default();
    let g32 = vec_of(n, 3);
    let g16: Vec<f16> = g32.iter().map(|&x| f16::from_f32(x * 256.0)).collect();
    let gb: Vec<bf16> = g32.iter().map(|&x| bf16::from_f32(x)).collect();
    let wide16: Vec<f32> = g16.iter().map(|x| x.to_f32() / 256.0).collect();
    let wideb: Vec<f32> = gb.iter().map(|x| x.to_f32()).collect();
    let cases = [
        (Grads::F16(&g16), 1.0 / 256.0, &wide16),
        (Grads::Bf16(&gb), 1.0, &wideb),
    ];
    for (grads, multiplier, wide) in cases {
        let init = vec_of(n, 4);
        let (mut p_ref, mut m_ref, mut v_ref) = (init.clone(), vec![0.0f32; n], vec![0.0f32; n]);
        adamw::update(&mut p_ref, wide, &mut m_ref, &mut v_ref, opt, 1);
        let (mut p, mut m, mut v) = (init, vec![0.0f32; n], vec![0.0f32; n]);
        let mut working = vec![f16::ZERO; n];
        let s = MasterStep {
            opt,
            step: 1,
            grad_multiplier: multiplier,
        };
        adamw_master_step(
            &mut p,
            &mut m,
            &mut v,
            grads,
            Some(Working::F16(&mut working)),
            s,
        );
        assert_eq!(bits(&p), bits(&p_ref));
        assert_eq!(bits(&v), bits(&v_ref));
        assert!(working
            .iter()
            .zip(&p)
            .all(|(w, &x)| w.to_bits() == f16::from_f32(x).to_bits()));
    }
}
