//! Tokenize a corpus once and keep the token stream in a token file under a cache folder the caller
//! chooses (e.g. `runs/cache/`); later runs read the file instead of re-tokenizing.
//!
//! The file name carries the corpus name, the tokenizer and the corpus fingerprint
//! (`shakespeare-gpt2-<16 hex>.tok`), so an edited corpus gets a new file and is never read from a
//! stale one. A cache file that exists but fails validation is an error naming it (delete it to
//! re-tokenize), not a silent re-tokenize: a corrupted disk should be noticed.
//!
//! ```no_run
//! let tokens = data::load_or_tokenize(
//!     &data::shakespeare(),
//!     &data::Tokenizer::gpt2(),
//!     std::path::Path::new("runs/cache"),
//! )
//! .unwrap();
//! println!("{} tokens from {}", tokens.tokens.len(), tokens.path.display());
//! ```

use std::path::{Path, PathBuf};

use crate::corpus::Corpus;
use crate::error::{DataError, Result};
use crate::token_file::{read_token_file, write_token_file};
use crate::tokenizer::Tokenizer;

/// A token stream and where it is cached.
#[derive(Debug, Clone)]
pub struct CachedTokens {
    pub tokens: Vec<u32>,
    pub vocab_size: u32,
    /// The token file (read from, or just written).
    pub path: PathBuf,
    /// True when the tokens were read from an existing file, false when freshly tokenized.
    pub from_cache: bool,
}

/// The cache file for a corpus and tokenizer inside `cache_dir`.
pub fn cache_path(corpus: &Corpus, tokenizer: &Tokenizer, cache_dir: &Path) -> PathBuf {
    let safe_name: String = corpus
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    cache_dir.join(format!(
        "{safe_name}-{}-{:016x}.tok",
        tokenizer.name(),
        corpus.fingerprint()
    ))
}

/// Reads the corpus's tokens from `cache_dir` if cached, else tokenizes it (EOT between documents)
/// and writes the cache atomically. Errors: an unreadable or invalid cache file, a cache for another
/// vocabulary, an empty corpus, or a write failure.
pub fn load_or_tokenize(
    corpus: &Corpus,
    tokenizer: &Tokenizer,
    cache_dir: &Path,
) -> Result<CachedTokens> {
    let path = cache_path(corpus, tokenizer, cache_dir);
    if path.exists() {
        let file = read_token_file(&path)?;
        if file.vocab_size != tokenizer.vocab_size() {
            return Err(DataError::VocabMismatch {
                path,
                found: file.vocab_size,
                expected: tokenizer.vocab_size(),
            });
        }
        return Ok(CachedTokens {
            tokens: file.tokens,
            vocab_size: file.vocab_size,
            path,
            from_cache: true,
        });
    }
    let tokens = tokenizer.encode_corpus(corpus);
    if tokens.is_empty() {
        return Err(DataError::EmptyDataset { split: "whole" });
    }
    write_token_file(&path, tokenizer.vocab_size(), &tokens)?;
    Ok(CachedTokens {
        tokens,
        vocab_size: tokenizer.vocab_size(),
        path,
        from_cache: false,
    })
}
