//! Training configs in and out: DeepSpeed's `ds_config.json` ([`deepspeed`]) and accelerate's
//! config YAML ([`accelerate`]) read into a `plan::TrainSetup`, and a setup written back as
//! either ([`emit`]).
//!
//! A config sets what it names; a value of `"auto"` takes the flag's value, as HF's Trainer fills
//! `"auto"` from its TrainingArguments. A flag moved off its default that disagrees with the
//! config is an error naming both (HF refuses such a mismatch too), and so is a key the reader
//! does not know, with the nearest known key suggested. Example:
//! `configs::deepspeed::read(&text, "ds_config.json", &flags, Some(4096))?`.

pub mod accelerate;
pub mod deepspeed;
pub mod emit;

use anyhow::bail;
use serde_json::Value;
use std::fmt::Display;

/// A setup read from a config, and what the reader wants the user told.
#[derive(Debug)]
pub struct Read {
    pub setup: plan::TrainSetup,
    /// One line: what the config set ("ZeRO-3, optimizer on cpu, bf16, ...").
    pub summary: String,
    /// Settings read that change device memory in ways the planner does not model.
    pub not_planned: Vec<String>,
}

/// The flags' values and their defaults, to tell a flag the user set from one left alone.
pub struct Flags<'a> {
    pub given: &'a plan::TrainSetup,
    pub default: &'a plan::TrainSetup,
}

/// The value a config sets for one field: the config's unless the flag was moved off its default
/// to something else, which is refused.
pub fn agree<T: PartialEq + Display>(
    origin: &str,
    key: &str,
    config: T,
    flag_name: &str,
    given: T,
    default: T,
) -> anyhow::Result<T> {
    if given != default && given != config {
        bail!(
            "{origin} sets {key} to {config}, but {flag_name} {given} was given: drop the flag \
             (the config decides) or change the config"
        );
    }
    Ok(config)
}

/// Names every key of `object` not among `known` (names separated by whitespace), as
/// `prefix.key` with the nearest known key.
pub fn unknown_keys(object: &Value, prefix: &str, known: &str, out: &mut Vec<String>) {
    let Some(map) = object.as_object() else {
        return;
    };
    let known: Vec<&str> = known.split_whitespace().collect();
    for key in map.keys() {
        if known.contains(&key.as_str()) {
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match nearest(key, &known) {
            Some(near) => out.push(format!("{path} (did you mean {near}?)")),
            None => out.push(path),
        }
    }
}

/// The known key within edit distance 3 of `key`, if any.
fn nearest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Refuses a config with unknown keys, naming them all.
pub fn refuse_unknown(origin: &str, unknown: &[String], what: &str) -> anyhow::Result<()> {
    if unknown.is_empty() {
        return Ok(());
    }
    let one = unknown.len() == 1;
    bail!(
        "{origin}: unknown {what} setting{}: {}; fix or remove {}",
        if one { "" } else { "s" },
        unknown.join(", "),
        if one { "it" } else { "them" },
    )
}

/// A config value: absent, `"auto"` (the flag decides), or set.
pub enum Setting<T> {
    Absent,
    Auto,
    Is(T),
}

/// A count (an integer, or a float with no fraction such as `5e8`), `"auto"`, or absent.
pub fn count(origin: &str, v: Option<&Value>, key: &str) -> anyhow::Result<Setting<u64>> {
    Ok(match v {
        None | Some(Value::Null) => Setting::Absent,
        Some(Value::String(s)) if s == "auto" => Setting::Auto,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Setting::Is(u),
            (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 => Setting::Is(f as u64),
            _ => bail!("{origin}: {key} is {n}: give a whole number of at least 0"),
        },
        Some(other) => bail!("{origin}: {key} is {other}: give a whole number or \"auto\""),
    })
}

/// A boolean, `"auto"`, or absent.
pub fn flag(origin: &str, v: Option<&Value>, key: &str) -> anyhow::Result<Setting<bool>> {
    Ok(match v {
        None | Some(Value::Null) => Setting::Absent,
        Some(Value::String(s)) if s == "auto" => Setting::Auto,
        Some(Value::Bool(b)) => Setting::Is(*b),
        Some(other) => bail!("{origin}: {key} is {other}: give true, false or \"auto\""),
    })
}

/// A string, or absent.
pub fn text<'a>(origin: &str, v: Option<&'a Value>, key: &str) -> anyhow::Result<Option<&'a str>> {
    Ok(match v {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(other) => bail!("{origin}: {key} is {other}: give a string"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_key_is_named_with_the_nearest_known_one() {
        let v: Value = serde_json::json!({"stage": 3, "reduce_bucket_sise": 5});
        let mut out = Vec::new();
        unknown_keys(
            &v,
            "zero_optimization",
            "stage reduce_bucket_size",
            &mut out,
        );
        assert_eq!(
            out,
            ["zero_optimization.reduce_bucket_sise (did you mean reduce_bucket_size?)"]
        );
    }

    /// Fuzzing the readers: 10,000 seeded mutations each of HF's ZeRO-3 example and of an
    /// accelerate FSDP config are read or refused, never a panic.
    #[test]
    fn mutated_configs_are_read_or_refused() {
        let ds = include_str!("../tests/data/configs/hf_zero3_offload.json");
        let yaml = include_str!("../tests/data/configs/accelerate_fsdp.yaml");
        let (given, default) = (
            plan::TrainSetup::new(4, 2048),
            plan::TrainSetup::new(1, 2048),
        );
        let flags = Flags {
            given: &given,
            default: &default,
        };
        let mut m = rng::mutate::Mutator::new(0x6473_6366);
        let (mut read, mut refused) = (0, 0);
        for _ in 0..10_000 {
            let bad = String::from_utf8_lossy(&m.mutate(ds.as_bytes())).into_owned();
            match deepspeed::read(&bad, "ds_config.json", &flags, Some(4096)) {
                Ok(_) => read += 1,
                Err(_) => refused += 1,
            }
            let bad = String::from_utf8_lossy(&m.mutate(yaml.as_bytes())).into_owned();
            let dir = std::path::Path::new("/nonexistent");
            match accelerate::read(&bad, "accelerate.yaml", dir, &flags, Some(4096)) {
                Ok(_) => read += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(
            read > 100 && refused > 100,
            "{read} read, {refused} refused"
        );
    }

    /// DeepSpeed's and accelerate's own defaults and older spellings, as their sources read them.
    #[test]
    fn defaults_and_legacy_forms_read_as_deepspeed_and_accelerate_read_them() {
        let (given, default) = (
            plan::TrainSetup::new(1, 2048),
            plan::TrainSetup::new(1, 2048),
        );
        let flags = Flags {
            given: &given,
            default: &default,
        };
        let ds = |text: &str| deepspeed::read(text, "ds.json", &flags, Some(4096));
        let mb = r#""train_micro_batch_size_per_gpu": 1"#;
        // A section without `enabled` is off; `bfloat16` is bf16's older name.
        let p = ds(&format!("{{{mb}, \"bf16\": {{}}}}"))
            .unwrap()
            .setup
            .precision;
        assert_eq!(p, plan::setup::Precision::Fp32);
        let p = ds(&format!("{{{mb}, \"bfloat16\": {{\"enabled\": true}}}}")).unwrap();
        assert_eq!(p.setup.precision, plan::setup::Precision::Bf16);
        // `"zero_optimization": true` is stage 1; autocast without a dtype is fp16 on CUDA.
        let z = ds(&format!("{{{mb}, \"zero_optimization\": true}}"))
            .unwrap()
            .setup
            .zero;
        assert_eq!(z, plan::setup::ZeroStage::Zero1);
        let a = ds(&format!(
            "{{{mb}, \"torch_autocast\": {{\"enabled\": true}}}}"
        ))
        .unwrap();
        assert_eq!(a.setup.precision, plan::setup::Precision::AmpFp16);
        // Batch sizes that multiply past 64 bits are refused, not wrapped.
        let huge = r#"{"train_micro_batch_size_per_gpu": 4294967296, "gradient_accumulation_steps": 4294967296, "train_batch_size": 1}"#;
        assert!(ds(huge).unwrap_err().to_string().contains("past 2^64"));
        let yaml = |text: &str| {
            accelerate::read(
                text,
                "a.yaml",
                std::path::Path::new("."),
                &flags,
                Some(4096),
            )
        };
        // FSDP1 as `accelerate config` writes it now, and FSDP2's boolean.
        let v1 = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 1\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n";
        assert_eq!(yaml(v1).unwrap().setup.zero, plan::setup::ZeroStage::Zero2);
        let v2 = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n";
        assert_eq!(yaml(v2).unwrap().setup.zero, plan::setup::ZeroStage::Zero2);
        // accelerate's DeepSpeed stage defaults to 2; N-D parallelism is refused, not ignored.
        let ds_default = "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  offload_optimizer_device: none\n";
        assert_eq!(
            yaml(ds_default).unwrap().setup.zero,
            plan::setup::ZeroStage::Zero2
        );
        let nd = "distributed_type: FSDP\nparallelism_config:\n  tp_size: 2\n";
        assert!(yaml(nd).unwrap_err().to_string().contains("tp_size"));
    }

    #[test]
    fn counts_take_floats_without_a_fraction() {
        let v = serde_json::json!(5e8);
        assert!(matches!(
            count("f", Some(&v), "k").unwrap(),
            Setting::Is(500_000_000)
        ));
        let v = serde_json::json!(1.5);
        assert!(count("f", Some(&v), "k").is_err());
    }
}
