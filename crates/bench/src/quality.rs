//! `frugal bench quality`: what weight and KV quantization cost a model trained here, on the
//! shipped corpus's validation split: for each storage format, the mean KL divergence of the
//! next-token distributions from the fp32 model's (at every position of every window) and the
//! validation loss, all from the same windows in the same run.
//!
//! Each window is one prefill whose logits are kept for every position (the KV cache is written
//! and then read within the step, so quantized keys and values are what attention sees).
//!
//! Example: `frugal bench quality --model run1 --windows 8 --seq 128 --json`.

use anyhow::bail;
use infer::Worker;
use models::ModelSource;
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};
use serde_json::json;
use std::path::PathBuf;
use term::Table;

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Example: frugal bench quality --model run1 --windows 8 --seq 128")]
pub struct Args {
    /// A model trained here (a training --out folder or snapshot, or an HF folder), fp32.
    #[arg(long)]
    pub model: PathBuf,
    /// Validation windows scored.
    #[arg(long, default_value_t = 8)]
    pub windows: usize,
    /// Tokens per window.
    #[arg(long, default_value_t = 128)]
    pub seq: u64,
    #[arg(long)]
    pub json: bool,
}

/// The formats compared: weights × KV.
fn cases() -> Vec<(WeightFormat, KvFormat)> {
    use KvFormat as K;
    use WeightFormat as W;
    vec![
        (W::F32, K::F32),
        (W::Bf16, K::F32),
        (W::Int8, K::F32),
        (
            W::Int4 {
                group: 32,
                asym: false,
            },
            K::F32,
        ),
        (
            W::Int4 {
                group: 128,
                asym: false,
            },
            K::F32,
        ),
        (
            W::Int4 {
                group: 32,
                asym: true,
            },
            K::F32,
        ),
        (W::Nf4 { group: 64 }, K::F32),
        // A GGUF file's own blocks (Q8_0's rule for other weights).
        (
            W::Ggml {
                group: 32,
                nibbles: plan::roles::Roles::NONE,
            },
            K::F32,
        ),
        (W::F32, K::Bf16),
        (W::F32, K::Int8),
        (W::F32, K::Fp8),
        (
            W::Int4 {
                group: 32,
                asym: false,
            },
            K::Int8,
        ),
    ]
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let (m, ls) = infer::sample::log_sum_exp(row);
    row.iter().map(|&x| f64::from(x - m) - ls).collect()
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.windows == 0 || a.seq < 2 {
        bail!("--windows must be at least 1 and --seq at least 2");
    }
    let model = ModelSource::at(&a.model)?;
    let tok = model.tokenizer()?;
    let source = model.load()?;
    if source.stored_format().is_some() {
        bail!("--model holds quantized weights; bench quality compares against the fp32 model: pass its fp32 folder");
    }
    let shape = source.config.shape.clone();
    let seq = a.seq.min(shape.max_positions);
    let cache_dir = std::env::temp_dir().join("frugal-token-cache");
    let cached = data::load_or_tokenize(&data::shakespeare(), &tok, &cache_dir)?;
    let dataset = data::Dataset::new(cached.tokens, tok.vocab_size(), data::DEFAULT_VAL_FRACTION)?;
    let val = dataset.val_tokens();
    let need = a.windows * (seq as usize + 1);
    if val.len() < need {
        bail!("the validation split has {} tokens; {need} are needed: fewer --windows or a shorter --seq", val.len());
    }
    let stride = (val.len() - seq as usize - 1) / a.windows.max(1);
    let windows: Vec<&[u32]> = (0..a.windows)
        .map(|w| &val[w * stride..w * stride + seq as usize + 1])
        .collect();
    let v = shape.vocab as usize;
    let limit = tok.vocab_size() as usize;
    let logits_of = |worker: &mut Worker, w: &[u32]| -> anyhow::Result<Vec<f32>> {
        let s = worker.new_sequence();
        let mut logits = Vec::new();
        worker.prefill_rows(s, &w[..seq as usize], seq as usize, &mut logits)?;
        worker.free(s);
        Ok(logits)
    };
    let setup_for = |w: WeightFormat, kv: KvFormat| ServeSetup {
        prefill_chunk: seq,
        prefill_logit_rows: seq,
        ..ServeSetup::generation(&shape, 1, seq, w, kv, 16, 1)
    };
    let mut reference = source.worker(setup_for(WeightFormat::F32, KvFormat::F32))?;
    let base: Vec<Vec<f32>> = windows
        .iter()
        .map(|w| logits_of(&mut reference, w))
        .collect::<anyhow::Result<_>>()?;
    drop(reference);
    let mut rows = Vec::new();
    // A group size must divide every matrix's columns.
    let fit = plan_frugal::serve::fitting_groups(&shape)?;
    let (cases, skipped): (Vec<_>, Vec<_>) = cases()
        .into_iter()
        .partition(|(w, _)| w.group().is_none_or(|g| fit.contains(&g)));
    let groups_that_do = match fit.is_empty() {
        true => "no group size does".to_string(),
        false => format!("groups that do: {fit:?}"),
    };
    let mut named = Vec::new();
    for (w, _) in &skipped {
        let what = format!("{} in groups of {}", w.name(), w.group().unwrap_or(0));
        if !named.contains(&what) {
            eprintln!("skipped {what}: the group does not divide every matrix's columns ({groups_that_do})");
            named.push(what);
        }
    }
    // Latent attention caches its latents in f32 or bf16 only.
    let latent = shape.mla.is_some();
    let (cases, skipped): (Vec<_>, Vec<_>) = cases
        .into_iter()
        .partition(|(_, kv)| !latent || matches!(kv, KvFormat::F32 | KvFormat::Bf16));
    for (_, kv) in &skipped {
        eprintln!(
            "skipped the {} KV cache: latent attention caches its latents in f32 or bf16",
            kv.name()
        );
    }
    for (wf, kv) in cases {
        let mut worker = source.worker(setup_for(wf, kv))?;
        let (mut kl, mut loss, mut n) = (0.0f64, 0.0f64, 0usize);
        for (w, b) in windows.iter().zip(&base) {
            let q = logits_of(&mut worker, w)?;
            for t in 0..seq as usize {
                let p = log_softmax(&b[t * v..t * v + limit]);
                let lq = log_softmax(&q[t * v..t * v + limit]);
                kl += p
                    .iter()
                    .zip(&lq)
                    .map(|(a, b)| a.exp() * (a - b))
                    .sum::<f64>();
                loss -= lq[w[t + 1] as usize];
                n += 1;
            }
        }
        let weights_bytes = worker.plan.persistent_bytes(plan::buffer::Category::Params);
        rows.push((wf, kv, kl / n as f64, loss / n as f64, weights_bytes));
    }
    if a.json {
        let cases: Vec<_> = rows
            .iter()
            .map(|(w, kv, kl, loss, bytes)| {
                json!({
                    "weights": w.name(), "weight_group": w.group(), "kv_dtype": kv.name(),
                    "kl_vs_fp32": kl, "val_loss": loss, "weights_bytes": bytes,
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "model": shape.name, "windows": a.windows, "seq": seq, "cases": cases })
        );
        return Ok(());
    }
    println!(
        "{}: {} validation windows of {seq} tokens; KL(fp32 ‖ format) of the next-token distribution, mean over positions",
        shape.name, a.windows
    );
    let mut t = Table::new(&["weights", "kv", "KL vs fp32", "val loss", "weight MiB"]);
    for (w, kv, kl, loss, bytes) in &rows {
        let name = match w.group() {
            Some(g) => format!("{} g{g}", w.name()),
            None => w.name().into(),
        };
        t.row(vec![
            name,
            kv.name().into(),
            format!("{kl:.2e}"),
            format!("{loss:.4}"),
            format!("{:.1}", *bytes as f64 / (1u64 << 20) as f64),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}
