//! What `model` needs of a GGUF file: the magic check, opening it, its config.json and the
//! tokenizer tables it embeds.

use std::path::Path;

/// A file that starts with GGUF's magic.
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// A file with GGUF's magic or its extension (so a damaged one gets the GGUF reader's error).
pub(super) fn is_gguf_file(path: &Path) -> bool {
    path.is_file() && (is_gguf(path) || path.extension().is_some_and(|e| e == "gguf"))
}

pub(super) fn open_gguf(path: &Path) -> anyhow::Result<gguf::Gguf> {
    Ok(gguf::Gguf::open(path)?)
}

/// The config.json of a GGUF model.
pub(super) fn gguf_config(g: &gguf::Gguf) -> anyhow::Result<String> {
    Ok(gguf::hf::Model::new(g)?.config_json()?)
}

/// The tokenizer tables a GGUF file embeds.
pub(super) fn gguf_vocab(g: &gguf::Gguf) -> anyhow::Result<data::hf_tokenizer::GgufVocab<'_>> {
    let text = |key: &str| g.get(key).ok().and_then(|v| v.as_str());
    let id = |key: &str| g.u64(key).ok().map(|v| v as u32);
    let types = match g.get("tokenizer.ggml.token_type") {
        Ok(v) => v
            .as_array()
            .unwrap_or_default()
            .iter()
            .map(|t| t.as_u64().unwrap_or(1))
            .collect(),
        Err(_) => Vec::new(),
    };
    Ok(data::hf_tokenizer::GgufVocab {
        source: g.path.to_str().unwrap_or("the GGUF file"),
        model: text("tokenizer.ggml.model").unwrap_or(""),
        pre: text("tokenizer.ggml.pre").unwrap_or("default"),
        tokens: g.strings("tokenizer.ggml.tokens")?,
        types,
        merges: g.strings("tokenizer.ggml.merges").unwrap_or_default(),
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        add_bos: g
            .get("tokenizer.ggml.add_bos_token")
            .ok()
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        chat_template: text("tokenizer.chat_template"),
    })
}
