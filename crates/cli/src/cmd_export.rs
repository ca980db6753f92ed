//! `frugal export SNAPSHOT --hf OUT`: a snapshot's model as a Hugging Face folder
//! (`config.json` + `model.safetensors`) that `AutoModelForCausalLM.from_pretrained(OUT)` loads.
//!
//! The weights are rebuilt from the snapshot's per-rank shard files (whatever rank count and ZeRO
//! stage wrote them) into a forward-only model (`infer::Runner`: weights and one pass's
//! activations, no trainer), then written with HF names by the engine's `io`, so an export also
//! proves the shards reassemble. `--logits FILE` adds frugal's own logits on a
//! prompt (`tokens` int32 (1, T), `logits` f32 (1, T, V)) for `dev/check_export.py` to compare
//! with transformers'. Nothing here trains or prints beyond one summary line.
//!
//! A LoRA run's snapshot holds adapters: `--merge --base DIR` writes the merged model instead
//! (W + (α/r)·B·A over the base rounded through the run's base format, as PEFT's merge over a
//! quantized base does).
//!
//! A GGUF file exports too: its weights dequantized to f32 (ggml's reference values), its
//! config.json, and its embedded tokenizer as `tokenizer.json` + `tokenizer_config.json` (with
//! the chat template), so the folder runs in transformers and in `frugal generate` alike.
//!
//! Example: `frugal export runs/a --hf runs/a-hf --logits runs/a-logits.safetensors`.

use anyhow::{bail, Context};
use infer::Runner;
use plan_frugal::ForwardSetup;
use std::path::{Path, PathBuf};
use train::snapshot::Snapshot;

#[derive(clap::Args, Clone, Debug)]
#[command(
    after_help = "Example: frugal export run1 --hf run1-hf (run1: a --out folder or one \
                        of its step-NNNNNN snapshots)"
)]
pub struct Args {
    /// A snapshot folder (step-NNNNNN), a training --out folder (its newest snapshot), or a
    /// GGUF file.
    pub snapshot: PathBuf,
    /// Write config.json and model.safetensors here (transformers' from_pretrained layout).
    #[arg(long)]
    pub hf: PathBuf,
    /// Also write frugal's logits on --prompt to this safetensors file (tokens, logits).
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// Text whose logits --logits records (GPT-2 tokens, cropped to the model's positions).
    #[arg(
        long,
        default_value = "ROMEO: But soft, what light through yonder window breaks?"
    )]
    pub prompt: String,
    /// A LoRA snapshot (its weights are the adapters): write the merged model, W + (α/r)·B·A
    /// over the base as training stored it (dequant(quant(W)) for a quantized base). Needs
    /// --base.
    #[arg(long)]
    pub merge: bool,
    /// The base the LoRA run trained over (its `--model`: an HF folder or a GGUF file).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Print one JSON object (snapshot, step, ranks, the folder and files written).
    #[arg(long)]
    pub json: bool,
    /// Replace a model already in --hf (without it, such a folder is refused).
    #[arg(long)]
    pub overwrite: bool,
}

/// Refuses an --hf folder that holds a model (unless --overwrite) or that is the source itself.
fn check_target(args: &Args) -> anyhow::Result<()> {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    if let (Some(hf), Some(src)) = (canonical(&args.hf), canonical(&args.snapshot)) {
        if src == hf || src.starts_with(&hf) {
            bail!(
                "--hf {} is where {} lives: export to another folder (the export would \
                 overwrite its own source)",
                args.hf.display(),
                args.snapshot.display()
            );
        }
    }
    let held = ["model.safetensors", "config.json"]
        .iter()
        .find(|f| args.hf.join(f).is_file());
    if let (Some(file), false) = (held, args.overwrite) {
        bail!(
            "--hf {} already holds a model ({file}): pass --overwrite to replace it, or export \
             to another folder",
            args.hf.display()
        );
    }
    Ok(())
}

/// A run's `--out` folder whose finished model is newer than its newest snapshot: exporting the
/// folder would give the snapshot's older weights, so it is refused, saying what to do instead.
fn check_finished_model(path: &Path, snap: &Snapshot) -> anyhow::Result<()> {
    let Some(finished) = train::snapshot::finished::step(path) else {
        return Ok(());
    };
    if finished <= snap.state.step {
        return Ok(());
    }
    bail!(
        "{} holds the run's finished model (step {finished}), newer than its newest snapshot \
         ({}, step {}): exporting the folder would give the snapshot's older weights. The \
         finished model is already in transformers' layout (adapters in PEFT's; `frugal train \
         --merge` also writes them merged into {}/merged): load {} as it is, or name a \
         snapshot to export it (frugal export {} --hf ...)",
        path.display(),
        snap.dir.display(),
        snap.state.step,
        path.display(),
        path.display(),
        snap.dir.display()
    )
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Ok(source @ models::ModelSource::Gguf(_)) = models::ModelSource::at(&args.snapshot) {
        return export_gguf(&args, &source);
    }
    let snap = Snapshot::open(&args.snapshot)
        .with_context(|| format!("exporting {}", args.snapshot.display()))?;
    check_finished_model(&args.snapshot, &snap)?;
    for (dir, why) in &snap.skipped {
        eprintln!(
            "warning: {} is damaged ({why}); exporting the newest intact snapshot, {}",
            dir.display(),
            snap.dir.display()
        );
    }
    let model = snap.model_config()?;
    let lora = lora_of(&snap)?;
    match (&lora, args.merge, &args.base) {
        (Some((lora, alpha)), true, Some(base)) => {
            if args.logits.is_some() {
                bail!("--logits with --merge: run the merged folder with frugal generate instead");
            }
            check_target(&args)?;
            return merge(&args, &snap, &model, lora, *alpha, base);
        }
        (Some(_), _, _) => bail!(
            "{} is a LoRA snapshot (its weights are adapters): add --merge --base DIR (the \
             base model folder the run trained over) to export the merged model",
            snap.dir.display()
        ),
        (None, true, _) | (None, _, Some(_)) => bail!(
            "--merge and --base export LoRA snapshots; {} is a full model's",
            snap.dir.display()
        ),
        (None, false, None) => check_target(&args)?,
    }
    let tokens = prompt_tokens(&args.prompt, &model, &snap.dir, args.logits.is_some())?;
    // One row of the prompt's length: the smallest arena that runs the logits.
    let setup = ForwardSetup {
        batch: 1,
        seq: tokens.len() as u64,
        attention: plan::setup::Attention::DEFAULT,
    };
    let mut runner = Runner::new(model, setup)?;
    let weights = snap.weights(&runner.model.units)?;
    for (u, unit) in weights.iter().enumerate() {
        runner.load_unit(u, unit);
    }
    engine::io::save_pretrained(&runner.model, &runner.arena, &args.hf)
        .with_context(|| format!("--hf {}", args.hf.display()))?;
    if let Some(path) = &args.logits {
        write_logits(&mut runner, &tokens, path)?;
    }
    if args.json {
        let v = serde_json::json!({
            "snapshot": snap.dir.display().to_string(),
            "step": snap.state.step,
            "ranks": snap.shard_count(),
            "hf": args.hf.display().to_string(),
            "files": [train::snapshot::CONFIG_FILE, train::snapshot::WEIGHTS_FILE],
            "logits": args.logits.as_ref().map(|p| p.display().to_string()),
        });
        println!("{v}");
    } else {
        println!(
            "exported {} (step {}, {}) to {}",
            snap.dir.display(),
            snap.state.step,
            term::plural(snap.shard_count() as u64, "rank"),
            args.hf.display()
        );
    }
    Ok(())
}

/// A GGUF file as a Hugging Face folder: f32 weights, config.json, its tokenizer files.
fn export_gguf(args: &Args, source: &models::ModelSource) -> anyhow::Result<()> {
    if args.merge || args.base.is_some() || args.logits.is_some() {
        bail!("--merge, --base and --logits export snapshots; a GGUF file exports alone");
    }
    check_target(args)?;
    let loaded = source.load()?;
    let setup = ForwardSetup {
        batch: 1,
        seq: 1,
        attention: plan::setup::Attention::DEFAULT,
    };
    let mut runner = Runner::new(loaded.config.clone(), setup)?;
    for (u, unit) in loaded.units()?.iter().enumerate() {
        runner.load_unit(u, unit);
    }
    let context = || format!("--hf {}", args.hf.display());
    engine::io::save_pretrained(&runner.model, &runner.arena, &args.hf).with_context(context)?;
    source
        .tokenizer()?
        .save_hf(&args.hf)
        .with_context(context)?;
    let files = [
        train::snapshot::CONFIG_FILE,
        train::snapshot::WEIGHTS_FILE,
        "tokenizer.json",
        "tokenizer_config.json",
    ];
    match args.json {
        true => println!(
            "{}",
            serde_json::json!({"gguf": source.name(), "hf": args.hf.display().to_string(),
                               "files": files})
        ),
        false => println!("exported {} to {}", source.name(), args.hf.display()),
    }
    Ok(())
}

/// The LoRA settings a snapshot recorded (`run.lora`), if it is a LoRA run's.
fn lora_of(snap: &Snapshot) -> anyhow::Result<Option<(plan::setup::Lora, f32)>> {
    let v = &snap.state.run.lora;
    if v.is_null() {
        return Ok(None);
    }
    let bad = || anyhow::anyhow!("{}: its run.lora is malformed: {v}", snap.dir.display());
    let base: plan::setup::Dtype = v["base"]
        .as_str()
        .ok_or_else(bad)?
        .parse()
        .map_err(|_| bad())?;
    let lora = plan::setup::Lora {
        rank: v["rank"].as_u64().ok_or_else(bad)? as u32,
        targets: v["targets"]
            .as_str()
            .ok_or_else(bad)?
            .split(',')
            .map(str::to_string)
            .collect(),
        base,
        double_quant: v["double_quant"].as_bool().ok_or_else(bad)?,
        dropout: v["dropout"].as_f64().unwrap_or(0.0) as f32,
        ggml: None,
    };
    Ok(Some((lora, v["alpha"].as_f64().ok_or_else(bad)? as f32)))
}

/// Refuses a `--base` whose weight files are not the ones the run trained over (the snapshot's
/// `run.lora.base_weights` fingerprint; a run over a preset's random weights recorded none).
fn check_base(snap: &Snapshot, base: &Path) -> anyhow::Result<()> {
    let Some(recorded) = snap.state.run.lora["base_weights"].as_str() else {
        return Ok(());
    };
    let files =
        models::saved::weight_files(base).with_context(|| format!("--base {}", base.display()))?;
    let found = train::base_fingerprint(&files)
        .with_context(|| format!("reading the weights of --base {}", base.display()))?;
    if format!("{found:016x}") != recorded {
        bail!(
            "--base {}: its weights are not the ones {} trained its adapters over (fingerprint \
             {found:016x}, the run recorded {recorded}); give the run's --model (its folder or \
             GGUF file)",
            base.display(),
            snap.dir.display()
        );
    }
    Ok(())
}

/// `--merge`: the base's HF weights through the base format, plus the snapshot's adapters.
fn merge(
    args: &Args,
    snap: &Snapshot,
    model: &engine::ModelConfig,
    lora: &plan::setup::Lora,
    alpha: f32,
    base: &Path,
) -> anyhow::Result<()> {
    let shape = &model.shape;
    use models::ModelSource;
    let what = "give the Hugging Face folder or GGUF file the run trained its adapters over (its \
                --model)";
    if base.symlink_metadata().is_err() {
        bail!("--base {} does not exist; {what}", base.display());
    }
    // `resolve`'s errors speak of --model and end listing every kind --model takes: keep what
    // is wrong, and say what a base is.
    let source = ModelSource::resolve(&base.to_string_lossy()).map_err(|e| {
        let e = format!("{e:#}").replacen("--model", "--base", 1);
        let cut = ["; pass", ": use one of"]
            .iter()
            .filter_map(|end| e.find(end))
            .min()
            .unwrap_or(e.len());
        anyhow::anyhow!("{}; {what}", &e[..cut])
    })?;
    let kind = match source {
        ModelSource::HfFolder(_) | ModelSource::Gguf(_) => None,
        ModelSource::Snapshot(_) => Some("a training run's snapshots"),
        ModelSource::Quantized(_) => Some("a quantized copy"),
        _ => Some("a config.json, a shape with no weights"),
    };
    if let Some(kind) = kind {
        bail!("--base {}: {kind}; {what}", base.display());
    }
    check_base(snap, base)?;
    // A ggml base: the layout of the GGUF file's own blocks.
    let mut lora = lora.clone();
    if lora.base == plan::setup::Dtype::Ggml {
        lora.ggml = Some(models::ggml_base(Some(base))?);
    }
    let lora = &lora;
    let units = plan_frugal::param_units(shape, 1)?;
    let base_values = models::saved::read_units(base, &units)
        .with_context(|| format!("--base {}", base.display()))?;
    let adapter_units = plan_frugal::adapters::adapter_units(shape, lora, 1)?;
    let adapters = snap.weights(&adapter_units)?;
    let tensors = train::peft::merge_host(shape, lora, alpha, base_values, &adapters)?;
    engine::io::save_hf(model, tensors, &args.hf)
        .with_context(|| format!("--hf {}", args.hf.display()))?;
    // The base's own tokenizer files beside the merged weights (GPT-2's models write none).
    let tokenizer = models::ModelSource::at(base)?
        .tokenizer()?
        .save_hf(&args.hf)
        .with_context(|| format!("--hf {}", args.hf.display()))?;
    let mut files = vec![train::snapshot::CONFIG_FILE, train::snapshot::WEIGHTS_FILE];
    if tokenizer {
        files.extend(["tokenizer.json", "tokenizer_config.json"]);
    }
    let summary = format!(
        "merged {} (step {}, LoRA r {} alpha {alpha} over a {:?} base) into {}",
        snap.dir.display(),
        snap.state.step,
        lora.rank,
        lora.base,
        args.hf.display()
    );
    match args.json {
        true => println!(
            "{}",
            serde_json::json!({
                "snapshot": snap.dir.display().to_string(), "step": snap.state.step,
                "merged": true, "hf": args.hf.display().to_string(),
                "files": files,
            })
        ),
        false => println!("{summary}"),
    }
    Ok(())
}

/// `prompt` in the run's own tokenizer (the `tokenizer.json` beside the snapshot or in the run's
/// folder, which a run over a GGUF or an HF folder writes there when it ends), else GPT-2's.
/// For `--logits` a model whose vocabulary GPT-2's ids overrun without its own tokenizer is
/// refused, rather than fed ids of another vocabulary.
fn prompt_tokens(
    prompt: &str,
    model: &engine::ModelConfig,
    snapshot: &Path,
    logits: bool,
) -> anyhow::Result<Vec<u32>> {
    let found = [Some(snapshot), snapshot.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join("tokenizer.json"))
        .find(|p| p.is_file());
    let tokenizer = match &found {
        Some(path) => data::Tokenizer::hf(data::hf_tokenizer::HfTokenizer::from_file(path)?),
        None if logits && model.shape.vocab < 50_257 => bail!(
            "--logits: no tokenizer.json beside {} or in its run's folder, and GPT-2's ids do not \
             fit the model's vocabulary of {}; copy the model's tokenizer.json there",
            snapshot.display(),
            model.shape.vocab
        ),
        None => data::Tokenizer::gpt2(),
    };
    let mut tokens = tokenizer.encode(prompt);
    tokens.truncate(model.shape.max_positions as usize);
    if tokens.is_empty() {
        bail!("--prompt is empty: give some text to compute logits on");
    }
    // Without --logits the prompt only sizes the arena.
    if let Some(&id) = (tokens.iter())
        .filter(|_| logits)
        .find(|&&id| u64::from(id) >= model.shape.vocab)
    {
        bail!(
            "--prompt holds token {id}, beyond the model's vocabulary of {}: use a prompt of \
             more common text",
            model.shape.vocab
        );
    }
    Ok(tokens)
}

fn write_logits(runner: &mut Runner, tokens: &[u32], path: &Path) -> anyhow::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let t = tokens.len();
    let logits = engine::eval::logits(runner, tokens, 1, t)?;
    let v = runner.model.config.shape.vocab as usize;
    let token_bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|&id| (id as i32).to_le_bytes())
        .collect();
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|l| l.to_le_bytes()).collect();
    let views = vec![
        (
            "tokens",
            TensorView::new(Dtype::I32, vec![1, t], &token_bytes)?,
        ),
        (
            "logits",
            TensorView::new(Dtype::F32, vec![1, t, v], &logit_bytes)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, path)
        .with_context(|| format!("--logits {}", path.display()))?;
    Ok(())
}
