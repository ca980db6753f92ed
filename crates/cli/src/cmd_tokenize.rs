//! `frugal tokenize`: the token ids a model's own tokenizer gives each text (llama.cpp's
//! `llama-tokenize`), and with `--decode` the text of ids, to check a tokenizer against another
//! implementation or see what a prompt costs.
//!
//! Example: `frugal tokenize --model SmolLM2-135M-Instruct.Q4_1.gguf "Hello world" --json`.

use anyhow::Context;
use models::ModelSource;
use serde_json::json;
use std::path::PathBuf;

const EXAMPLES: &str = "\
Examples:
  frugal tokenize --model model.gguf \"Hello world\"          ids, one text per line
  frugal tokenize --model hf-folder \"one\" \"two\" --json      one JSON object per text
  frugal tokenize --model model.gguf --decode 19556 905     the text of ids";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The model whose tokenizer to use (any --model of generate; GPT-2's for models trained
    /// here and the presets).
    #[arg(long)]
    pub model: PathBuf,
    /// Texts to encode (no BOS is added), or with --decode, token ids.
    #[arg(required = true)]
    pub texts: Vec<String>,
    /// Decode the given ids instead.
    #[arg(long)]
    pub decode: bool,
    /// One JSON object per text: {"text": ..., "ids": [...]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = ModelSource::at(&args.model)?;
    let tok = model.tokenizer()?;
    if args.decode {
        let ids = args
            .texts
            .iter()
            .map(|t| {
                t.parse::<u32>()
                    .with_context(|| format!("--decode: {t:?} is not a token id"))
            })
            .collect::<anyhow::Result<Vec<u32>>>()?;
        let text = tok.decode_text(&ids)?;
        match args.json {
            true => println!("{}", json!({"ids": ids, "text": text})),
            false => println!("{text}"),
        }
        return Ok(());
    }
    for text in &args.texts {
        let ids = tok.encode(text);
        match args.json {
            true => println!("{}", json!({"text": text, "ids": ids})),
            false => println!(
                "{}",
                ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
            ),
        }
    }
    Ok(())
}
