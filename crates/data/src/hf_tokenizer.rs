//! A model's own tokenizer, run by Hugging Face's `tokenizers` crate: from a `tokenizer.json`
//! (with `tokenizer_config.json` beside it for the special tokens and the chat template), or
//! built from the vocabulary a GGUF file embeds (`tokenizer.ggml.*`), written as the
//! `tokenizer.json` transformers would write for it and loaded the same way.
//!
//! GGUF vocabularies read: BPE `gpt2` with llama.cpp's pre-tokenizers `default`/`gpt2`/`gpt-2`
//! (GPT-2's split), `smollm`/`starcoder`/`refact` (each digit alone, then GPT-2's split),
//! `llama-bpe` (Llama 3's split) and `qwen2`; SentencePiece `llama` (`spm`). Another model or
//! pre-tokenizer is refused by name.
//!
//! Example: `let tok = HfTokenizer::from_file(Path::new("model/tokenizer.json"))?;`

mod spm;

use crate::error::{DataError, Result};
use serde_json::{json, Value};
use std::path::Path;

/// A model's tokenizer and the special ids around it.
pub struct HfTokenizer {
    pub tokenizer: tokenizers::Tokenizer,
    /// `hf-` and a checksum of the tables (the token cache's key).
    pub name: String,
    pub vocab_size: u32,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Whether a prompt starts with `bos`.
    pub add_bos: bool,
    pub chat_template: Option<String>,
    /// A token that decodes to `A` alone, put before a continuation's ids so a decoder that
    /// drops a text's leading space (SentencePiece's) keeps the continuation's.
    probe: Option<u32>,
}

/// The pieces of a GGUF file's `tokenizer.ggml.*` metadata.
pub struct GgufVocab<'a> {
    /// The file, named in errors.
    pub source: &'a str,
    pub model: &'a str,
    pub pre: &'a str,
    pub tokens: Vec<&'a str>,
    /// SentencePiece's piece scores (empty for BPE).
    pub scores: Vec<f32>,
    pub unk: Option<u32>,
    /// SentencePiece: a space (`▁`) goes before the text.
    pub add_space_prefix: bool,
    /// ggml's token types (1 normal, 3 control, 4 user-defined, ...), if the file has them.
    pub types: Vec<u64>,
    pub merges: Vec<&'a str>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<&'a str>,
}

/// Llama 3's split (llama.cpp's `llama-bpe`), as its tokenizer.json writes it.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn fail(source: &str, reason: impl Into<String>) -> DataError {
    DataError::Tokenizer {
        source_name: source.into(),
        reason: reason.into(),
    }
}

/// A `tokenizer.json`'s text as the `tokenizers` crate reads it. The JSON is checked first (a
/// syntax error named by line and column), and a panic inside the crate on a structure it does
/// not expect becomes an error.
fn parse(text: &str) -> std::result::Result<tokenizers::Tokenizer, String> {
    serde_json::from_str::<Value>(text).map_err(|e| e.to_string())?;
    // The crate's panic message would print before the clean error: this thread's panics are
    // quiet while it parses (other threads' print as before).
    thread_local! {
        static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info)
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>());
    QUIET.with(|q| q.set(false));
    parsed
        .map_err(|_| "its structure is not a tokenizer's".to_string())?
        .map_err(|e| e.to_string())
}

impl HfTokenizer {
    /// A `tokenizer.json`; `tokenizer_config.json` beside it, when there is one, names the BOS
    /// and EOS tokens, whether prompts start with BOS, and the chat template (or
    /// `chat_template.jinja` does).
    pub fn from_file(path: &Path) -> Result<HfTokenizer> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| fail(&source, e.to_string()))?;
        let tokenizer = parse(&text).map_err(|e| fail(&source, format!("does not parse: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        // Optional; one that is there but does not parse is an error, never silently skipped.
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read_to_string(&config_path) {
            Err(_) => Value::Null,
            Ok(t) => serde_json::from_str(&t).map_err(|e| {
                fail(
                    &config_path.display().to_string(),
                    format!("does not parse: {e}"),
                )
            })?,
        };
        let id_of = |key: &str| {
            let token = match &config[key] {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
                _ => None,
            };
            token.and_then(|t| tokenizer.token_to_id(&t))
        };
        let (bos, eos) = (id_of("bos_token"), id_of("eos_token"));
        let template = config["chat_template"]
            .as_str()
            .map(String::from)
            .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        let add_bos = config["add_bos_token"].as_bool().unwrap_or(false);
        Ok(HfTokenizer::finish(
            tokenizer, &text, bos, eos, add_bos, template,
        ))
    }

    /// The tokenizer a GGUF file embeds.
    pub fn from_gguf(v: &GgufVocab<'_>) -> Result<HfTokenizer> {
        let (normalizer, pre, decoder, model) = match v.model {
            "gpt2" => {
                let (pre, decoder, model) = byte_level_bpe(v)?;
                (Value::Null, pre, decoder, model)
            }
            "llama" => {
                let (normalizer, decoder, model) =
                    spm::parts(&v.tokens, &v.scores, v.unk, v.add_space_prefix);
                (normalizer, Value::Null, decoder, model)
            }
            other => {
                return Err(fail(
                    v.source,
                    format!(
                        "tokenizer.ggml.model {other:?} is not read (BPE \"gpt2\" and \
                         SentencePiece \"llama\" vocabularies are)"
                    ),
                ))
            }
        };
        let ids: std::collections::HashSet<&str> = v.tokens.iter().copied().collect();
        if ids.len() != v.tokens.len() {
            return Err(fail(v.source, "the vocabulary repeats a token"));
        }
        // Unknown (2), control (3) and user-defined (4) tokens match whole, before the split, as
        // transformers' added tokens do.
        let added: Vec<Value> = v
            .types
            .iter()
            .zip(&v.tokens)
            .enumerate()
            .filter(|(_, (&t, _))| (2..=4).contains(&t))
            .map(|(id, (&t, token))| {
                json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": t != 4})
            })
            .collect();
        let doc = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": null,
            "decoder": decoder, "model": model,
        });
        let text = doc.to_string();
        let tokenizer: tokenizers::Tokenizer = text.parse().map_err(|e| {
            fail(
                v.source,
                format!("the embedded vocabulary does not build: {e}"),
            )
        })?;
        let template = v.chat_template.map(String::from);
        Ok(HfTokenizer::finish(
            tokenizer, &text, v.bos, v.eos, v.add_bos, template,
        ))
    }

    fn finish(
        tokenizer: tokenizers::Tokenizer,
        text: &str,
        bos: Option<u32>,
        eos: Option<u32>,
        add_bos: bool,
        chat_template: Option<String>,
    ) -> HfTokenizer {
        let vocab_size = tokenizer.get_vocab_size(true) as u32;
        // The piece `A` (not the byte token, which fuses with the bytes after it).
        let probe = tokenizer
            .token_to_id("A")
            .filter(|&id| tokenizer.decode(&[id], false).is_ok_and(|d| d == "A"));
        HfTokenizer {
            tokenizer,
            name: format!("hf-{:08x}", crc32fast::hash(text.as_bytes())),
            vocab_size,
            bos,
            eos,
            add_bos,
            chat_template,
            probe,
        }
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (BOS, EOS, whether prompts start with
    /// BOS, the chat template) into `dir`, as transformers' `save_pretrained` lays them out.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let io = |path: std::path::PathBuf| {
            move |cause: std::io::Error| DataError::Io {
                action: "writing",
                path,
                cause,
            }
        };
        let json = self
            .tokenizer
            .to_string(true)
            .map_err(|e| fail(&self.name, format!("serialising: {e}")))?;
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json).map_err(io(path.clone()))?;
        let name = |id: Option<u32>| id.and_then(|i| self.tokenizer.id_to_token(i));
        let config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": name(self.bos),
            "eos_token": name(self.eos),
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        });
        let path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises");
        std::fs::write(&path, text).map_err(io(path.clone()))?;
        Ok(())
    }

    /// The ids of `text` (special tokens written in it are matched whole; no BOS added).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self.tokenizer.encode_fast(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            // The model's own vocabulary encodes any string; a failure would be a bug in it.
            Err(e) => panic!("tokenizing with the model's vocabulary failed: {e}"),
        }
    }

    /// The text of `ids` as a continuation (generated tokens after a prompt), special tokens
    /// included: a leading space stays, which SentencePiece's decoder drops from a whole text.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(p) = self.probe {
            let with: Vec<u32> = std::iter::once(p).chain(ids.iter().copied()).collect();
            if let Some(rest) = self.decode_text(&with)?.strip_prefix('A') {
                return Ok(rest.to_string());
            }
        }
        self.decode_text(ids)
    }

    /// The text of `ids` as a whole text, as the tokenizer's own decoder gives it.
    pub fn decode_text(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| fail(&self.name, format!("decoding: {e}")))
    }
}

/// A byte-level BPE vocabulary's pre-tokenizer (llama.cpp's `tokenizer.ggml.pre`), decoder and
/// model.
fn byte_level_bpe(v: &GgufVocab<'_>) -> Result<(Value, Value, Value)> {
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let split = |pattern: &str| {
        json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
               "invert": false})
    };
    let pre = match v.pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" => byte_level(true),
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" => json!({"type": "Sequence",
            "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}),
        "qwen2" | "stablelm2" => json!({"type": "Sequence", "pretokenizers": [
            split(QWEN2_SPLIT), byte_level(false)]}),
        other => {
            return Err(fail(
                v.source,
                format!(
                    "pre-tokenizer {other:?} is not read (gpt2, smollm, starcoder, llama-bpe, \
                     qwen2 and their aliases are)"
                ),
            ))
        }
    };
    let vocab: serde_json::Map<String, Value> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), json!(id)))
        .collect();
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                         "use_regex": true});
    // Llama 3's vocabulary takes a word that is a token whole, before any merge.
    let ignore_merges = matches!(v.pre, "llama-bpe" | "llama3" | "llama-v3");
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null,
                       "continuing_subword_prefix": null, "end_of_word_suffix": null,
                       "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                       "vocab": vocab, "merges": v.merges});
    Ok((pre, decoder, model))
}
