//! `frugal perplexity`: a model's perplexity on a text, computed as llama.cpp's
//! `llama-perplexity` computes it: the text tokenized whole by the model's tokenizer, cut into
//! chunks of `--ctx` tokens (the first token of each replaced by BOS when the model adds one),
//! each chunk one forward pass, only its second half scored; PPL = exp(mean negative
//! log-likelihood), with its standard error. The chunks run on the inference engine in the
//! weight and KV formats asked for (default: as generate: a quantized GGUF file's own blocks),
//! so a run measures what a format costs.
//!
//! Example: `frugal perplexity --model SmolLM2-135M-Instruct.Q4_1.gguf --ctx 512 --chunks 20`.

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use models::ModelSource;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

const EXAMPLES: &str = "\
Examples:
  frugal perplexity --model model.gguf                       the shipped Tempest, 512-token chunks
  frugal perplexity --model model.gguf --data my.txt --ctx 1024 --chunks 10
  frugal perplexity --model model.gguf --weights f32          the file's values in f32
  frugal perplexity --model run1 --weights int4 --kv-dtype int8  what quantization costs
  frugal perplexity --model run1 --json                      a model trained here (GPT-2's tokens)";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The model (any --model of generate with weights: a GGUF file, an HF folder, a training
    /// --out folder, ...).
    #[arg(long)]
    pub model: PathBuf,
    /// A UTF-8 text file (default: the shipped Tempest).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tokens per chunk (llama.cpp's -c); the second half of each is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Chunks to score (default: every whole chunk of the text).
    #[arg(long)]
    pub chunks: Option<usize>,
    #[command(flatten)]
    pub storage: crate::cmd_generate::Storage,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.ctx < 4 {
        bail!(
            "--ctx {}: a chunk needs at least 4 tokens (2 scored)",
            args.ctx
        );
    }
    let model = ModelSource::at(&args.model)?;
    let tok = model.tokenizer()?;
    let source = model.load()?;
    if args.ctx as u64 > source.config.shape.max_positions {
        bail!(
            "--ctx {}: longer than the model's context of {} tokens",
            args.ctx,
            source.config.shape.max_positions
        );
    }
    let text = match &args.data {
        Some(path) => crate::cmd_train::setup::corpus(Some(path))?
            .documents
            .iter()
            .map(|d| d.text.as_ref())
            .collect::<Vec<_>>()
            .join(data::DOCUMENT_SEPARATOR),
        None => data::shakespeare()
            .documents
            .iter()
            .find(|d| d.name == "tempest")
            .map(|d| d.text.to_string())
            .expect("the shipped corpus holds the Tempest"),
    };
    let mut tokens: Vec<u32> = tok.bos().into_iter().collect();
    tokens.extend(tok.encode(&text));
    let whole = tokens.len() / args.ctx;
    let n_chunks = args.chunks.map_or(whole, |c| c.min(whole));
    if n_chunks == 0 {
        bail!(
            "the text is {} tokens, shorter than one chunk of --ctx {}: give more text or a \
             smaller --ctx",
            tokens.len(),
            args.ctx
        );
    }
    let (weights, kv) = args.storage.formats(&source)?;
    let ctx = args.ctx as u64;
    let setup = plan_frugal::ServeSetup {
        prefill_chunk: ctx,
        prefill_logit_rows: ctx,
        ..plan_frugal::ServeSetup::generation(&source.config.shape, 1, ctx, weights, kv, 16, 1)
    };
    let mut worker = source.worker(setup)?;
    let (width, limit) = (worker.vocab(), tok.vocab_size() as usize);
    if limit > width {
        bail!(
            "--model {}: its tokenizer has {limit} tokens, more than the model's {width} \
             embedding rows",
            args.model.display()
        );
    }
    let mut logits = Vec::new();
    let bar = match args.json {
        true => ProgressBar::hidden(),
        false => ProgressBar::new(n_chunks as u64),
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} chunk {pos}/{len} | {msg} | {elapsed}<{eta}")
            .expect("a valid template"),
    );
    let mut plain = term::PlainProgress::new("perplexity", n_chunks as u64, args.json);
    let (first, t0) = (args.ctx / 2, Instant::now());
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    for i in 0..n_chunks {
        let start = i * args.ctx;
        let mut inputs = tokens[start..start + args.ctx].to_vec();
        if let Some(bos) = tok.bos() {
            inputs[0] = bos;
        }
        // Row j predicts token start + j + 1; the chunk's last row predicts past it and is not
        // scored (llama.cpp scores rows ctx/2 .. ctx - 2).
        let s = worker.new_sequence();
        worker.prefill_rows(s, &inputs, args.ctx, &mut logits)?;
        worker.free(s);
        let lp = (first..args.ctx - 1).map(|j| {
            let row = &logits[j * width..j * width + limit];
            log_prob(row, tokens[start + j + 1] as usize)
        });
        for l in lp {
            nll -= l;
            nll2 += l * l;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        plain.tick(i as u64 + 1, &format!("| ppl {ppl:.4} "));
        bar.set_message(format!("ppl {ppl:.4}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    // llama-perplexity's uncertainty: the standard error of the mean NLL, times the PPL.
    let var = nll2 / count as f64 - mean * mean;
    let stderr = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    let tokens_per_s = (n_chunks * args.ctx) as f64 / secs;
    if args.json {
        let v = json!({
            "ppl": ppl, "ppl_stderr": stderr, "nll_mean": mean, "chunks": n_chunks,
            "ctx": args.ctx, "scored_tokens": count, "text_tokens": tokens.len(),
            "tokens_per_s": tokens_per_s, "weights": weights.name(), "kv_dtype": kv.name(),
        });
        println!("{v}");
    } else {
        println!(
            "PPL = {ppl:.4} +/- {stderr:.5} over {n_chunks} chunks of {} tokens ({count} scored, \
             {:.0} tokens/s; weights {}, KV {})",
            args.ctx,
            tokens_per_s,
            weights.name(),
            kv.name()
        );
    }
    Ok(())
}

/// log softmax(row)[target], in f64.
fn log_prob(row: &[f32], target: usize) -> f64 {
    let (m, ln_sum) = infer::sample::log_sum_exp(row);
    f64::from(row[target] - m) - ln_sum
}
