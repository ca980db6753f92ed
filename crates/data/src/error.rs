//! The one error type of the `data` crate: every operating error (bad file, bad text, bad token,
//! a data set too small for the batch asked for) with the facts a user needs to fix it.
//!
//! Programmer errors (a batch buffer of the wrong length) are `assert!`s, not variants here.
//!
//! Example: `DataError::TooShort { split: "train", needed_tokens: 2049, have_tokens: 100, .. }`
//! displays as "the train split has 100 tokens, but one batch of 4 × (512 + 1) … needs 2049".

use std::path::PathBuf;

/// Everything that can go wrong reading text, tokenizing, caching tokens or batching them.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or folder could not be read or written.
    /// (The OS error is in the message, not a `source`, so a chain prints it once.)
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },

    /// A model's tokenizer (tokenizer.json, or the vocabulary a GGUF file embeds) cannot be
    /// built or used.
    #[error("the tokenizer of {source_name}: {reason}")]
    Tokenizer { source_name: String, reason: String },

    /// A text file is not UTF-8.
    #[error(
        "{path} is not UTF-8 text (invalid byte sequence at byte {valid_up_to}); \
         convert it to UTF-8 (e.g. `iconv -t UTF-8`) or leave it out"
    )]
    NotUtf8 { path: PathBuf, valid_up_to: usize },

    /// A path that is neither a file nor a folder (a device, a pipe).
    #[error("{path} is not a regular file or folder (a device or a pipe is never read); point at a UTF-8 text file or a folder of .txt files")]
    NotAFile { path: PathBuf },

    /// The text is larger than the memory it would be read into.
    #[error(
        "{path} holds {bytes} bytes of text; the whole corpus is read into memory and {max} \
         bytes fit here: give a smaller file or a folder with fewer files"
    )]
    TooLarge { path: PathBuf, bytes: u64, max: u64 },

    /// A folder holds no `.txt` file.
    #[error("{path} holds no .txt files; point at a UTF-8 text file or a folder of .txt files")]
    NoTextFiles { path: PathBuf },

    /// The text, or every text in a folder, is empty.
    #[error("{path} holds no text (0 bytes after loading); give a non-empty text file")]
    EmptyText { path: PathBuf },

    /// A token file does not start with the magic bytes `FRUGTOK1`.
    #[error(
        "{path} is not a frugal token file: it starts with {found:?}, expected b\"FRUGTOK1\"; \
         delete it to re-tokenize"
    )]
    BadMagic { path: PathBuf, found: Vec<u8> },

    /// A token file was written by another version of the format.
    #[error(
        "{path} is token file version {found}, this build reads version {supported}; \
         delete it to re-tokenize"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// A token file's size does not match what its header says (truncated or padded).
    #[error(
        "{path} is {actual_bytes} bytes, but its header promises {expected_bytes} \
         (truncated or corrupted); delete it to re-tokenize"
    )]
    LengthMismatch {
        path: PathBuf,
        expected_bytes: u64,
        actual_bytes: u64,
    },

    /// A token file's payload does not match the checksum in its header.
    #[error(
        "{path} is corrupted: payload crc32 is {computed:#010x}, header says {stored:#010x}; \
         delete it to re-tokenize"
    )]
    ChecksumMismatch {
        path: PathBuf,
        stored: u32,
        computed: u32,
    },

    /// A token file was written for a different vocabulary than the caller expects.
    #[error(
        "{path} holds tokens for a vocabulary of {found}, expected {expected}; \
         delete it to re-tokenize"
    )]
    VocabMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },

    /// A token id is not below the vocabulary size. `path` is the token file it came from, if any.
    #[error(
        "token id {token} at index {index}{} is out of range for a vocabulary of {vocab_size} \
         (ids must be < {vocab_size}); the tokens were made with another tokenizer or are corrupted",
        path.as_ref().map(|p| format!(" in {}", p.display())).unwrap_or_default()
    )]
    TokenOutOfRange {
        path: Option<PathBuf>,
        index: usize,
        token: u32,
        vocab_size: u32,
    },

    /// A vocabulary size of zero.
    #[error("vocabulary size must be at least 1, got 0")]
    ZeroVocab,

    /// No tokens at all.
    #[error("the {split} data set is empty (0 tokens); give a non-empty corpus")]
    EmptyDataset { split: &'static str },

    /// So few tokens that the validation split takes them all.
    #[error(
        "the corpus is too short: {total} token(s), and the validation split holds out \
         {held_out}, leaving none to train on; give a longer --data"
    )]
    NothingToTrain { total: usize, held_out: usize },

    /// Not enough tokens for one global batch of windows of `seq_len + 1` tokens.
    #[error(
        "the {split} split has {have_tokens} tokens, but one batch of {world_size} x {batch_size} \
         rows (ranks x --batch) x (--seq {seq_len} + 1) needs at least {needed_tokens}; use a \
         larger --data, a smaller --batch or --seq, or fewer --ranks{}",
        if *split == "validation" {
            " (the validation split is the last tenth of the tokens)"
        } else {
            ""
        }
    )]
    TooShort {
        split: &'static str,
        needed_tokens: u64,
        have_tokens: u64,
        batch_size: usize,
        seq_len: usize,
        world_size: usize,
    },

    /// A batch size or sequence length of zero.
    #[error("batch size and sequence length must be at least 1, got batch {batch_size}, seq_len {seq_len}")]
    ZeroShape { batch_size: usize, seq_len: usize },

    /// A rank outside `0..world_size`, or a world of zero ranks.
    #[error("rank {rank} is not in 0..{world_size} (world size must be ≥ 1)")]
    BadRank { rank: usize, world_size: usize },

    /// A validation fraction outside `[0, 1)`.
    #[error("validation fraction must be in [0, 1), got {val_fraction}")]
    BadValFraction { val_fraction: f64 },

    /// A loader position past the end of an epoch (e.g. a snapshot from another batch shape).
    #[error(
        "loader position batch {batch_in_epoch} of epoch {epoch} is past the epoch's \
         {batches_per_epoch} batches; the snapshot was made with another data set or batch shape"
    )]
    SeekOutOfRange {
        epoch: u64,
        batch_in_epoch: u64,
        batches_per_epoch: u64,
    },
}

impl DataError {
    /// Wraps an IO error with what was being done and to which path.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        DataError::Io {
            action,
            path: path.into(),
            cause: source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
