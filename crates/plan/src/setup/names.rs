//! The names of the setup's choices, as every command spells them: `FromStr` parses a flag's value
//! (one spelling set for `plan`, `fit`, `train` and `bench`), `Display` prints the canonical
//! spelling back (`fit`'s "plan it" line, reports, errors), so `x.to_string().parse() == Ok(x)`.
//!
//! A bad value's error lists what is accepted; clap shows it after the flag's name. Aliases:
//! `eager` and `naive` are the same attention; `adam` is `adamw`; `f32`/`f16` are `fp32`/`fp16`.
//!
//! Example: `"every:2".parse::<Recompute>()` is `Ok(Recompute::Every(2))`.

use super::{Attention, Convention, Dtype, Offload, Optimizer, Precision, Recompute, ZeroStage};
use std::fmt;
use std::str::FromStr;

/// Looks `s` up in `table` (canonical spelling first in each row), or says what is accepted.
fn lookup<T: Copy>(s: &str, table: &[(&[&str], T)], accepted: &str) -> Result<T, String> {
    table
        .iter()
        .find(|(names, _)| names.contains(&s))
        .map(|&(_, v)| v)
        .ok_or_else(|| format!("use {accepted}"))
}

/// The canonical spelling of `v` in `table`.
fn canonical<T: PartialEq>(v: &T, table: &[(&'static [&'static str], T)]) -> &'static str {
    table
        .iter()
        .find(|(_, t)| t == v)
        .map(|(names, _)| names[0])
        .expect("every value has a name")
}

const PRECISIONS: [(&[&str], Precision); 6] = [
    (&["fp32", "f32"], Precision::Fp32),
    (&["amp-bf16"], Precision::AmpBf16),
    (&["amp-fp16"], Precision::AmpFp16),
    (&["bf16"], Precision::Bf16),
    (&["fp16", "f16"], Precision::Fp16),
    (&["pure-bf16"], Precision::PureBf16),
];

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(
            s,
            &PRECISIONS,
            "fp32, amp-bf16, amp-fp16, bf16, fp16 or pure-bf16",
        )
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &PRECISIONS))
    }
}

const OPTIMIZERS: [(&[&str], Optimizer); 3] = [
    (&["adamw", "adam"], Optimizer::AdamW),
    (&["adamw8bit"], Optimizer::AdamW8bit),
    (&["sgd"], Optimizer::Sgd),
];

impl FromStr for Optimizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(s, &OPTIMIZERS, "adamw, adamw8bit or sgd")
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &OPTIMIZERS))
    }
}

const ZERO_STAGES: [(&[&str], ZeroStage); 4] = [
    (&["0"], ZeroStage::Zero0),
    (&["1"], ZeroStage::Zero1),
    (&["2"], ZeroStage::Zero2),
    (&["3"], ZeroStage::Zero3),
];

impl FromStr for ZeroStage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(s, &ZERO_STAGES, "0, 1, 2 or 3").map_err(|_| {
            "ZeRO has stages 0, 1, 2 and 3: --zero 1 shards the optimizer state, --zero 2 also \
             the gradients, --zero 3 also the parameters"
                .into()
        })
    }
}

impl fmt::Display for ZeroStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &ZERO_STAGES))
    }
}

const RECOMPUTE_ACCEPTED: &str = "none, full, every:K (K >= 1), sqrt, selective (Megatron's: the \
     attention core) or keep-matmuls (keep the matmul outputs, recompute the rest)";

impl FromStr for Recompute {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => Recompute::None,
            "full" => Recompute::Full,
            "sqrt" => Recompute::Sqrt,
            "selective" => Recompute::Selective,
            "keep-matmuls" => Recompute::KeepMatmuls,
            _ => match s.strip_prefix("every:").map(str::parse::<u32>) {
                Some(Ok(k)) if k >= 1 => Recompute::Every(k),
                _ => return Err(format!("use {RECOMPUTE_ACCEPTED}")),
            },
        })
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recompute::None => f.write_str("none"),
            Recompute::Full => f.write_str("full"),
            Recompute::Every(k) => write!(f, "every:{k}"),
            Recompute::Sqrt => f.write_str("sqrt"),
            Recompute::Selective => f.write_str("selective"),
            Recompute::KeepMatmuls => f.write_str("keep-matmuls"),
        }
    }
}

const ATTENTIONS: [(&[&str], Attention); 2] = [
    (&["flash"], Attention::Flash),
    (&["eager", "naive"], Attention::Eager),
];

impl FromStr for Attention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(
            s,
            &ATTENTIONS,
            "flash (no T×T matrix kept) or eager (also spelled naive: the T×T probabilities kept)",
        )
    }
}

impl fmt::Display for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &ATTENTIONS))
    }
}

const OFFLOADS: [(&[&str], Offload); 3] = [
    (&["none"], Offload::None),
    (&["optimizer"], Offload::Optimizer),
    (&["params"], Offload::Params),
];

impl FromStr for Offload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(s, &OFFLOADS, "none, optimizer or params")
    }
}

impl fmt::Display for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &OFFLOADS))
    }
}

const DTYPES: [(&[&str], Dtype); 8] = [
    (&["fp32", "f32"], Dtype::F32),
    (&["fp16", "f16"], Dtype::F16),
    (&["bf16"], Dtype::Bf16),
    (&["fp8"], Dtype::Fp8),
    (&["int8"], Dtype::Int8),
    (&["int4"], Dtype::Int4),
    (&["nf4"], Dtype::Nf4),
    (&["ggml"], Dtype::Ggml),
];

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(s, &DTYPES, "fp32, fp16, bf16, fp8, int8, int4, nf4 or ggml")
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &DTYPES))
    }
}

const CONVENTIONS: [(&[&str], Convention); 2] = [
    (&["deepspeed"], Convention::Deepspeed),
    (&["paper"], Convention::Paper),
];

impl FromStr for Convention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        lookup(
            s,
            &CONVENTIONS,
            "deepspeed (what DeepSpeed allocates) or paper (the ZeRO paper's 2 + 2 + 12)",
        )
    }
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(canonical(self, &CONVENTIONS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: FromStr<Err = String> + fmt::Display + PartialEq + fmt::Debug>(all: &[T]) {
        for v in all {
            assert_eq!(v.to_string().parse::<T>().as_ref(), Ok(v), "{v}");
        }
    }

    #[test]
    fn every_value_prints_a_name_that_parses_back() {
        round_trips(&PRECISIONS.map(|(_, v)| v));
        round_trips(&OPTIMIZERS.map(|(_, v)| v));
        round_trips(&ZERO_STAGES.map(|(_, v)| v));
        round_trips(&ATTENTIONS.map(|(_, v)| v));
        round_trips(&OFFLOADS.map(|(_, v)| v));
        round_trips(&DTYPES.map(|(_, v)| v));
        round_trips(&[
            Recompute::None,
            Recompute::Full,
            Recompute::Every(3),
            Recompute::Sqrt,
            Recompute::Selective,
            Recompute::KeepMatmuls,
        ]);
    }

    #[test]
    fn aliases_and_bad_values() {
        assert_eq!("naive".parse::<Attention>(), Ok(Attention::Eager));
        assert_eq!("eager".parse::<Attention>(), Ok(Attention::Eager));
        assert_eq!("adam".parse::<Optimizer>(), Ok(Optimizer::AdamW));
        assert!("every:0"
            .parse::<Recompute>()
            .unwrap_err()
            .contains("every:K"));
        assert!("fp64".parse::<Precision>().unwrap_err().contains("bf16"));
        assert!("4"
            .parse::<ZeroStage>()
            .unwrap_err()
            .contains("stages 0, 1, 2 and 3"));
    }
}
