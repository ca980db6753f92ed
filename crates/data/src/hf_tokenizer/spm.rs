//! A SentencePiece vocabulary (GGUF's `llama` tokenizer model: Llama 1/2, Mistral, TinyLlama,
//! Phi-3) as the `tokenizer.json` transformers writes for it (`LlamaTokenizerFast`): a BPE with
//! byte fallback whose merges come from the pieces' scores, spaces as `▁` and one before the
//! text, no pre-tokenizer (the whole text merges at once, highest-scoring pair first, as
//! SentencePiece's BPE and llama.cpp's tokenizer do).

use serde_json::{json, Value};
use std::collections::HashMap;

/// The `▁` that stands for a space.
const SPACE: &str = "\u{2581}";

/// Every pair of pieces whose concatenation is a piece, ordered as transformers'
/// `SentencePieceExtractor` orders them: by the joined piece's score, highest first, then by
/// the joined piece's id and the halves' ids.
pub(super) fn merges(tokens: &[&str], scores: &[f32]) -> Vec<[String; 2]> {
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut all = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        let mut local: Vec<(usize, usize)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*ids.get(l)?, *ids.get(r)?))
            })
            .collect();
        local.sort();
        let score = scores.get(id).copied().unwrap_or(0.0);
        all.extend(local.into_iter().map(|(l, r)| (score, id, l, r)));
    }
    // Stable: pieces of one score keep their id order.
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    all.into_iter()
        .map(|(_, _, l, r)| [tokens[l].to_string(), tokens[r].to_string()])
        .collect()
}

/// The normalizer, decoder and model of the tokenizer.json; `unk` names the unknown piece.
pub(super) fn parts(
    tokens: &[&str],
    scores: &[f32],
    unk: Option<u32>,
    add_space_prefix: bool,
) -> (Value, Value, Value) {
    let replace = |from: &str, to: &str| json!({"type": "Replace", "pattern": {"String": from}, "content": to});
    let mut normalizers = vec![replace(" ", SPACE)];
    let mut decoders = vec![
        replace(SPACE, " "),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        normalizers.insert(0, json!({"type": "Prepend", "prepend": SPACE}));
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.to_string(), json!(id)))
        .collect();
    let unk = unk.and_then(|u| tokens.get(u as usize));
    let model = json!({"type": "BPE", "dropout": null, "unk_token": unk,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false, "vocab": vocab,
        "merges": merges(tokens, scores)});
    (
        json!({"type": "Sequence", "normalizers": normalizers}),
        json!({"type": "Sequence", "decoders": decoders}),
        model,
    )
}
