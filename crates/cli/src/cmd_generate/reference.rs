//! `frugal generate --kv-cache off`: the reference that recomputes the whole prefix for every
//! token with the fp32 model (no KV cache), to check the engine against.

use super::Args;
use anyhow::bail;
use infer::sample::Sampling;
use models::Loaded;
use serde_json::json;
use std::time::Instant;

/// `--kv-cache off`: the fp32 model recomputing every prefix (engine::eval::generate).
pub(super) fn run(
    args: &Args,
    source: &Loaded,
    tok: &data::Tokenizer,
    prompt: &[u32],
    sampling: Sampling,
) -> anyhow::Result<()> {
    let ranks = args.tp != 1 || args.comm == comm::Transport::Mpi;
    let quantized = args.storage.weights.as_deref().is_some_and(|w| w != "f32");
    if args.draft.is_some() || ranks || quantized || args.storage.weight_group.is_some() {
        bail!(
            "--kv-cache off is the fp32 reference: it takes neither --draft, --tp, --comm mpi, \
             --weights nor --weight-group"
        );
    }
    let units = source.units()?;
    let context = (prompt.len() + args.max_new_tokens) as u64;
    let setup = plan_frugal::ForwardSetup {
        batch: 1,
        seq: context,
        attention: plan::setup::Attention::Flash,
    };
    let mut runner = infer::Runner::new(source.config.clone(), setup)?;
    for (u, w) in units.iter().enumerate() {
        runner.load_unit(u, w);
    }
    let t0 = Instant::now();
    let s = engine::eval::Sampling {
        top_k: sampling.top_k,
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        seed: args.seed,
        vocab_limit: sampling.vocab_limit,
    };
    let tokens = engine::eval::generate(
        &mut runner,
        prompt,
        args.max_new_tokens,
        context as usize,
        s,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let text = tok.decode(&tokens).unwrap_or_default();
    if args.json {
        let v = json!({
            "tokens": tokens, "text": text, "kv_cache": "off", "prompt_tokens": prompt.len(),
            "prompt_token_ids": prompt,
            "decode_tokens_per_s": tokens.len() as f64 / secs,
        });
        println!("{v}");
    } else {
        println!("{}{}", args.prompt, text);
        eprintln!(
            "{} tokens in {secs:.2} s ({:.1} tokens/s), recomputing the prefix every token (no KV cache)",
            tokens.len(),
            tokens.len() as f64 / secs
        );
    }
    Ok(())
}
