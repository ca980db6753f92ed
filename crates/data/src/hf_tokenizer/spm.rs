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

#[cfg(test)]
mod tests {
    use super::super::{GgufVocab, HfTokenizer};

    /// A SentencePiece vocabulary of its specials, the 256 byte pieces and a few words.
    fn vocab() -> (Vec<String>, Vec<f32>, Vec<u64>) {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
        let words = ["\u{2581}", "H", "i", "\u{2581}H", "Hi", "\u{2581}Hi", "A"];
        tokens.extend(words.map(String::from));
        let mut scores = vec![0.0; 259];
        scores.extend([-1.0, -2.0, -3.0, -4.0, -5.0, -0.5, -6.0]);
        let mut types = vec![2, 3, 3];
        types.extend([6; 256]);
        types.extend([1; 7]);
        (tokens, scores, types)
    }

    #[test]
    fn pieces_merge_by_score_fall_back_to_bytes_and_keep_a_continuations_space() {
        let (tokens, scores, types) = vocab();
        let tok = HfTokenizer::from_gguf(&GgufVocab {
            source: "test",
            model: "llama",
            pre: "default",
            tokens: tokens.iter().map(String::as_str).collect(),
            scores,
            unk: Some(0),
            add_space_prefix: true,
            types,
            merges: Vec::new(),
            bos: Some(1),
            eos: Some(2),
            add_bos: true,
            chat_template: None,
        })
        .unwrap();
        let hi = 259 + 5;
        assert_eq!(tok.encode("Hi Hi"), [hi, hi]);
        // No piece for "é": its two UTF-8 bytes, after the space piece.
        assert_eq!(tok.encode("é"), [259, 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(tok.decode_text(&[hi, hi]).unwrap(), "Hi Hi");
        // Generated after a prompt, the first piece keeps its space.
        assert_eq!(tok.decode(&[hi]).unwrap(), " Hi");
        assert_eq!(tok.decode(&[259, 3 + 0xC3, 3 + 0xA9]).unwrap(), " é");
    }
}
