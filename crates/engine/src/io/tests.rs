//! Loading checkpoints: non-finite weights refused naming the tensor, and mutated checkpoints
//! loaded or refused, never a panic.

use super::*;

/// A NaN or an infinity anywhere in a checkpoint is refused on load, naming the tensor.
#[test]
fn non_finite_weights_are_refused_naming_the_tensor() {
    let shape = crate::testkit::llama_tiny();
    let units = plan_frugal::param_units(&shape, 1).unwrap();
    let parts: Vec<(String, Vec<u64>)> = units
        .iter()
        .flat_map(|u| u.views.iter().flat_map(|v| v.parts.iter()))
        .map(|p| (p.name.clone(), p.hf_shape.clone()))
        .collect();
    let victim = parts[parts.len() / 2].0.clone();
    for bad in [f32::NAN, f32::INFINITY] {
        let err = read_units_by(&units, "model.safetensors", &mut |name| {
            let shape = parts.iter().find(|p| p.0 == name).unwrap().1.clone();
            let mut data = vec![0.5f32; shape.iter().product::<u64>() as usize];
            if name == victim {
                data[3] = bad;
            }
            Ok((shape, data))
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains(&victim) && err.contains("element 3"), "{err}");
    }
    let ok = read_units_by(&units, "model.safetensors", &mut |name| {
        let shape = parts.iter().find(|p| p.0 == name).unwrap().1.clone();
        Ok((
            shape.clone(),
            vec![0.5f32; shape.iter().product::<u64>() as usize],
        ))
    });
    assert!(ok.is_ok());
}

/// Fuzzing the safetensors loader: 3,000 seeded mutations of a whole tiny Llama checkpoint
/// (header, offsets, data) each load or fail with an error, never a panic.
#[test]
fn mutated_checkpoints_load_or_fail_clearly() {
    let shape = crate::testkit::llama_tiny();
    let units = plan_frugal::param_units(&shape, 1).unwrap();
    let tensors: Vec<HfTensor> = units
        .iter()
        .flat_map(|u| u.views.iter().flat_map(|v| v.parts.iter()))
        .map(|p| HfTensor {
            name: p.name.clone(),
            shape: p.hf_shape.clone(),
            data: vec![0.25; p.hf_shape.iter().product::<u64>() as usize],
        })
        .collect();
    let good = tensors_to_safetensors(tensors);
    assert!(read_units(&units, &[("m".into(), &good[..])], "").is_ok());
    let mut m = rng::mutate::Mutator::new(0x7361_6665);
    let (mut loaded, mut refused) = (0, 0);
    for _ in 0..3000 {
        // Mutations land in the header (the first few hundred bytes) as often as in data.
        let head = good.len().min(2048);
        let mut bad = m.mutate(&good[..head]);
        bad.extend_from_slice(&good[head..]);
        match read_units(&units, &[("m".into(), &bad[..])], "") {
            Ok(_) => loaded += 1,
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(refused > 100, "{loaded} loaded, {refused} refused");
}
