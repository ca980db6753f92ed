//! The `data` crate: text in, training batches out.
//!
//! - `corpus`: named documents, and the shipped Shakespeare corpus embedded in the binary.
//! - `text_files`: load a UTF-8 text file or a folder of `.txt` files (file IO).
//! - `tokenizer`: GPT-2 BPE (`r50k_base` via tiktoken-rs, bundled ranks, offline); EOT between
//!   documents.
//! - `token_file` and `cache`: the binary token file (`FRUGTOK1` header, crc32, atomic writes) and
//!   tokenize-once caching under a folder the caller picks (file IO).
//! - `dataset`, `loader`, `validation`: the train/validation split, shuffled (B, T) training
//!   batches sharded over data-parallel ranks with a resumable position, and fixed validation
//!   batches.
//! - `rng`: SplitMix64, the shuffle's generator.
//!
//! It knows nothing about models or memory plans, and never prints. Every operating error is a
//! [`DataError`].
//!
//! ```no_run
//! use std::path::Path;
//! let tok = data::Tokenizer::gpt2();
//! let cached = data::load_or_tokenize(&data::shakespeare(), &tok, Path::new("runs/cache")).unwrap();
//! let ds = data::Dataset::new(cached.tokens, tok.vocab_size(), data::DEFAULT_VAL_FRACTION).unwrap();
//! let shape = data::BatchShape::single(4, 64);
//! let mut train = ds.train_loader(data::LoaderConfig::shuffled(shape, 1337)).unwrap();
//! let (mut x, mut y) = (vec![0u32; 4 * 64], vec![0u32; 4 * 64]);
//! train.next_batch(&mut x, &mut y);
//! ```

mod cache;
mod corpus;
mod dataset;
mod error;
pub mod hf_tokenizer;
mod loader;
mod text_files;
mod token_file;
mod tokenizer;
mod validation;

pub use cache::{cache_path, load_or_tokenize, CachedTokens};
pub use corpus::{
    shakespeare, shakespeare_text, Corpus, Document, DOCUMENT_SEPARATOR, SHAKESPEARE_PLAYS,
};
pub use dataset::{BatchShape, Dataset, DEFAULT_VAL_FRACTION};
pub use error::{DataError, Result};
pub use loader::{Loader, LoaderConfig, LoaderPosition, WindowOrder};
pub use rng::SplitMix64;
pub use text_files::{load_text_path, load_text_path_within};
pub use token_file::{
    decode_token_file, encode_token_file, read_token_file, token_width_bytes, write_token_file,
    TokenFile, TOKEN_FILE_HEADER_BYTES, TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION,
};
pub use tokenizer::{Tokenizer, EOT, GPT2_VOCAB_SIZE};
pub use validation::ValBatches;
