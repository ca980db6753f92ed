//! Tokenizers: GPT-2's byte-pair encoding (tiktoken's `r50k_base`, 50257 ids, `<|endoftext|>` =
//! 50256) through `tiktoken-rs`, whose merge ranks are compiled into the binary (the default, for
//! the shipped corpus and the presets), or a model's own tokenizer through Hugging Face's
//! `tokenizers` crate (`crate::hf_tokenizer`: a `tokenizer.json`, or the vocabulary a GGUF file
//! embeds).
//!
//! Text is encoded as ordinary text: a literal "<|endoftext|>" inside a document is spelled out as
//! ordinary tokens, never turned into the special id, so only [`Tokenizer::encode_corpus`] places
//! [`EOT`] (between documents, as GPT-2's training data does).
//!
//! ```
//! let tok = data::Tokenizer::gpt2();
//! let ids = tok.encode("To be, or not to be");
//! assert_eq!(tok.decode(&ids).unwrap(), "To be, or not to be");
//! ```

use std::sync::Arc;
use tiktoken_rs::CoreBPE;

use crate::corpus::Corpus;
use crate::error::{DataError, Result};
use crate::hf_tokenizer::HfTokenizer;

/// GPT-2's vocabulary size: 50000 merges + 256 bytes + `<|endoftext|>`.
pub const GPT2_VOCAB_SIZE: u32 = 50257;
/// GPT-2's `<|endoftext|>` id, placed between documents.
pub const EOT: u32 = 50256;

/// A tokenizer: GPT-2's, or a model's own. Cheap to clone (the tables are shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Gpt2(&'static CoreBPE),
    Hf(Arc<HfTokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("name", &self.name())
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// GPT-2's BPE (`r50k_base`). The first call parses the bundled ranks (a fraction of a second).
    pub fn gpt2() -> Self {
        Tokenizer {
            inner: Inner::Gpt2(tiktoken_rs::r50k_base_singleton()),
        }
    }

    /// A model's own tokenizer.
    pub fn hf(tokenizer: HfTokenizer) -> Self {
        Tokenizer {
            inner: Inner::Hf(Arc::new(tokenizer)),
        }
    }

    /// A short name, used in token cache file names (a model's tokenizer: a hash of its tables,
    /// so two vocabularies never share a cache).
    pub fn name(&self) -> String {
        match &self.inner {
            Inner::Gpt2(_) => "gpt2".into(),
            Inner::Hf(t) => t.name.clone(),
        }
    }

    /// Number of token ids: every id is `< vocab_size()`.
    pub fn vocab_size(&self) -> u32 {
        match &self.inner {
            Inner::Gpt2(_) => GPT2_VOCAB_SIZE,
            Inner::Hf(t) => t.vocab_size,
        }
    }

    /// The end-of-sequence id (generation stops there; documents are joined with it).
    pub fn eos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gpt2(_) => Some(EOT),
            Inner::Hf(t) => t.eos,
        }
    }

    /// The id put before a prompt, if the model adds one.
    pub fn bos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gpt2(_) => None,
            Inner::Hf(t) => t.add_bos.then_some(t.bos).flatten(),
        }
    }

    /// Writes a model's own tokenizer into `dir` as transformers lays it out (`tokenizer.json`,
    /// `tokenizer_config.json`); GPT-2's writes nothing (false), as models trained here use it.
    pub fn save_hf(&self, dir: &std::path::Path) -> Result<bool> {
        match &self.inner {
            Inner::Gpt2(_) => Ok(false),
            Inner::Hf(t) => t.save(dir).map(|()| true),
        }
    }

    /// The chat template the model ships, if any (Jinja source).
    pub fn chat_template(&self) -> Option<&str> {
        match &self.inner {
            Inner::Gpt2(_) => None,
            Inner::Hf(t) => t.chat_template.as_deref(),
        }
    }

    /// The text of a token id (special tokens by their name), for templates and stops.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Gpt2(_) => self.decode(&[id]).ok(),
            Inner::Hf(t) => t.tokenizer.id_to_token(id),
        }
    }

    /// Encodes ordinary text (GPT-2's: no special tokens recognised; a model's own tokenizer
    /// recognises its special tokens, as llama.cpp and transformers do for a chat prompt).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.inner {
            Inner::Gpt2(bpe) => bpe.encode_ordinary(text),
            Inner::Hf(t) => t.encode(text),
        }
    }

    /// Encodes every document and joins them with [`EOT`] between documents (none before the first
    /// or after the last). One thread: the whole shipped corpus took 0.09-0.15 s here (release
    /// build), and splitting the plays over 2 threads measured slower on this 2-core machine
    /// (fresh regex caches per thread), so it is not worth the code.
    pub fn encode_corpus(&self, corpus: &Corpus) -> Vec<u32> {
        let mut tokens = Vec::new();
        for (doc_idx, doc) in corpus.documents.iter().enumerate() {
            if let (true, Some(eos)) = (doc_idx > 0, self.eos()) {
                tokens.push(eos);
            }
            tokens.extend(self.encode(&doc.text));
        }
        tokens
    }

    /// Decodes ids that continue a text (generated tokens) to text: a leading space stays.
    /// Byte sequences that are not valid UTF-8 (a sample cut inside a multi-byte character)
    /// become U+FFFD; an id `>= vocab_size()` is an error.
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        self.check_ids(tokens)?;
        match &self.inner {
            Inner::Gpt2(bpe) => {
                let bytes: Vec<u8> = bpe
                    ._decode_native_and_split(tokens.to_vec())
                    .flatten()
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Inner::Hf(t) => t.decode(tokens),
        }
    }

    /// As [`Tokenizer::decode`], for ids that start a text: a SentencePiece vocabulary's
    /// leading space (the one it puts before every text) is dropped, as its decoder does.
    pub fn decode_text(&self, tokens: &[u32]) -> Result<String> {
        self.check_ids(tokens)?;
        match &self.inner {
            Inner::Gpt2(_) => self.decode(tokens),
            Inner::Hf(t) => t.decode_text(tokens),
        }
    }

    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().position(|&t| t >= self.vocab_size()) {
            None => Ok(()),
            Some(index) => Err(DataError::TokenOutOfRange {
                path: None,
                index,
                token: tokens[index],
                vocab_size: self.vocab_size(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{shakespeare, Document};
    use std::borrow::Cow;

    #[test]
    fn known_gpt2_ids() {
        // Ids from GPT-2's published vocabulary: "Hello" = 15496, " world" = 995.
        let tok = Tokenizer::gpt2();
        assert_eq!(tok.encode("Hello world"), vec![15496, 995]);
        assert_eq!(tok.decode(&[EOT]).unwrap(), "<|endoftext|>");
        // The special string in ordinary text is not the special id.
        assert!(!tok.encode("<|endoftext|>").contains(&EOT));
    }

    #[test]
    fn corpus_slice_round_trips() {
        let tok = Tokenizer::gpt2();
        let text = &shakespeare().documents[3].text[..60_000];
        let ids = tok.encode(text);
        assert!(ids.len() > 10_000 && ids.iter().all(|&t| t < GPT2_VOCAB_SIZE));
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }

    #[test]
    fn corpus_encoding_puts_eot_between_documents_only() {
        let tok = Tokenizer::gpt2();
        let corpus = Corpus {
            name: "t".into(),
            documents: ["one fish", "two fish", "red fish"]
                .iter()
                .map(|t| Document {
                    name: "d".into(),
                    text: Cow::Borrowed(*t),
                })
                .collect(),
        };
        let ids = tok.encode_corpus(&corpus);
        let mut expected = tok.encode("one fish");
        for text in ["two fish", "red fish"] {
            expected.push(EOT);
            expected.extend(tok.encode(text));
        }
        assert_eq!(ids, expected);
    }

    #[test]
    fn decode_rejects_ids_beyond_vocab() {
        let err = Tokenizer::gpt2().decode(&[15496, 50257]).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::TokenOutOfRange {
                    index: 1,
                    token: 50257,
                    ..
                }
            ),
            "{err}"
        );
    }
}
