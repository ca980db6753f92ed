//! The GPT-2 byte-pair encoding (tiktoken's `r50k_base`, 50257 ids, `<|endoftext|>` = 50256),
//! through `tiktoken-rs`, whose merge ranks are compiled into the binary: no network, no files.
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

use tiktoken_rs::CoreBPE;

use crate::corpus::Corpus;
use crate::error::{DataError, Result};

/// GPT-2's vocabulary size: 50000 merges + 256 bytes + `<|endoftext|>`.
pub const GPT2_VOCAB_SIZE: u32 = 50257;
/// GPT-2's `<|endoftext|>` id, placed between documents.
pub const EOT: u32 = 50256;

/// The GPT-2 BPE tokenizer. Cheap to copy: the merge tables are built once per process.
#[derive(Clone, Copy)]
pub struct Tokenizer {
    bpe: &'static CoreBPE,
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
            bpe: tiktoken_rs::r50k_base_singleton(),
        }
    }

    /// A short name, used in token cache file names.
    pub fn name(&self) -> &'static str {
        "gpt2"
    }

    /// Number of token ids: every id is `< vocab_size()`.
    pub fn vocab_size(&self) -> u32 {
        GPT2_VOCAB_SIZE
    }

    /// Encodes ordinary text (no special tokens recognised).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }

    /// Encodes every document and joins them with [`EOT`] between documents (none before the first
    /// or after the last). One thread: the whole shipped corpus took 0.09-0.15 s here (release
    /// build), and splitting the plays over 2 threads measured slower on this 2-core machine
    /// (fresh regex caches per thread), so it is not worth the code.
    pub fn encode_corpus(&self, corpus: &Corpus) -> Vec<u32> {
        let mut tokens = Vec::new();
        for (doc_idx, doc) in corpus.documents.iter().enumerate() {
            if doc_idx > 0 {
                tokens.push(EOT);
            }
            tokens.extend(self.encode(&doc.text));
        }
        tokens
    }

    /// Decodes ids to text. Byte sequences that are not valid UTF-8 (a sample cut inside a
    /// multi-byte character) become U+FFFD; an id `>= vocab_size()` is an error.
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        self.check_ids(tokens)?;
        let bytes: Vec<u8> = self
            .bpe
            ._decode_native_and_split(tokens.to_vec())
            .flatten()
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
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
