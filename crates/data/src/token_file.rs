//! The binary token file: a tokenized corpus cached on disk so a run does not re-tokenize.
//!
//! Layout (all integers little-endian), 28 header bytes then the payload:
//!
//! | offset | size | field                                                    |
//! |-------:|-----:|----------------------------------------------------------|
//! | 0      | 8    | magic `b"FRUGTOK1"`                                      |
//! | 8      | 4    | version, u32 (= [`TOKEN_FILE_VERSION`])                  |
//! | 12     | 4    | vocabulary size, u32                                     |
//! | 16     | 8    | token count, u64                                         |
//! | 24     | 4    | crc32 (IEEE, as `crc32fast`) of the payload bytes        |
//! | 28     | …    | tokens: u16 each if vocab ≤ 65536 (all ids fit), else u32 |
//!
//! Reading checks the magic, version, file length, checksum and that every token is below the
//! vocabulary, each failure a [`DataError`] naming the file. Writing goes to a temporary file in the
//! same folder, is synced, then renamed over the target: a crash never leaves a half-written file
//! under the final name. This module and `text_files.rs` are the crate's only file IO.
//!
//! ```no_run
//! use std::path::Path;
//! data::write_token_file(Path::new("runs/cache/x.tok"), 50257, &[15496, 995]).unwrap();
//! let file = data::read_token_file(Path::new("runs/cache/x.tok")).unwrap();
//! assert_eq!(file.tokens, [15496, 995]);
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// The first 8 bytes of every token file.
pub const TOKEN_FILE_MAGIC: [u8; 8] = *b"FRUGTOK1";
/// The layout version this build writes and reads.
pub const TOKEN_FILE_VERSION: u32 = 1;
/// Bytes before the payload.
pub const TOKEN_FILE_HEADER_BYTES: usize = 28;

/// A token file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile {
    pub vocab_size: u32,
    pub tokens: Vec<u32>,
}

/// Bytes per token for a vocabulary: 2 when every id (< vocab_size) fits a u16.
pub fn token_width_bytes(vocab_size: u32) -> usize {
    if vocab_size <= 1 << 16 {
        2
    } else {
        4
    }
}

/// Serialises tokens into the file layout above. Errors if the vocabulary is 0 or a token is not
/// below it (nothing invalid is ever written).
pub fn encode_token_file(vocab_size: u32, tokens: &[u32]) -> Result<Vec<u8>> {
    check_tokens(None, vocab_size, tokens)?;
    let width = token_width_bytes(vocab_size);
    let mut payload = Vec::with_capacity(tokens.len() * width);
    for &t in tokens {
        if width == 2 {
            // Cannot truncate: check_tokens proved t < vocab_size <= 65536.
            payload.extend_from_slice(&(t as u16).to_le_bytes());
        } else {
            payload.extend_from_slice(&t.to_le_bytes());
        }
    }
    let mut bytes = Vec::with_capacity(TOKEN_FILE_HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&TOKEN_FILE_MAGIC);
    bytes.extend_from_slice(&TOKEN_FILE_VERSION.to_le_bytes());
    bytes.extend_from_slice(&vocab_size.to_le_bytes());
    bytes.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Parses and validates a token file's bytes; `path` is only used to name the file in errors.
pub fn decode_token_file(path: &Path, bytes: &[u8]) -> Result<TokenFile> {
    let path_buf = || path.to_path_buf();
    if bytes.len() < TOKEN_FILE_MAGIC.len() || bytes[..8] != TOKEN_FILE_MAGIC {
        return Err(DataError::BadMagic {
            path: path_buf(),
            found: bytes[..bytes.len().min(8)].to_vec(),
        });
    }
    if bytes.len() < TOKEN_FILE_HEADER_BYTES {
        return Err(DataError::LengthMismatch {
            path: path_buf(),
            expected_bytes: TOKEN_FILE_HEADER_BYTES as u64,
            actual_bytes: bytes.len() as u64,
        });
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let version = u32_at(8);
    if version != TOKEN_FILE_VERSION {
        return Err(DataError::UnsupportedVersion {
            path: path_buf(),
            found: version,
            supported: TOKEN_FILE_VERSION,
        });
    }
    let vocab_size = u32_at(12);
    if vocab_size == 0 {
        return Err(DataError::ZeroVocab);
    }
    let n_tokens = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let stored_crc = u32_at(24);
    let width = token_width_bytes(vocab_size);
    // Saturating: a corrupted count must give a length error, not an overflow.
    let expected_bytes = n_tokens
        .saturating_mul(width as u64)
        .saturating_add(TOKEN_FILE_HEADER_BYTES as u64);
    if expected_bytes != bytes.len() as u64 {
        return Err(DataError::LengthMismatch {
            path: path_buf(),
            expected_bytes,
            actual_bytes: bytes.len() as u64,
        });
    }
    let payload = &bytes[TOKEN_FILE_HEADER_BYTES..];
    let computed_crc = crc32fast::hash(payload);
    if computed_crc != stored_crc {
        return Err(DataError::ChecksumMismatch {
            path: path_buf(),
            stored: stored_crc,
            computed: computed_crc,
        });
    }
    let tokens: Vec<u32> = if width == 2 {
        payload
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    } else {
        payload
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    check_tokens(Some(path), vocab_size, &tokens)?;
    Ok(TokenFile { vocab_size, tokens })
}

/// Reads and validates a token file.
pub fn read_token_file(path: &Path) -> Result<TokenFile> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io("cannot read", path, e))?;
    decode_token_file(path, &bytes)
}

/// Writes a token file atomically (temporary file in the same folder, sync, rename), creating the
/// parent folder if needed.
pub fn write_token_file(path: &Path, vocab_size: u32, tokens: &[u32]) -> Result<()> {
    let bytes = encode_token_file(vocab_size, tokens)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| DataError::io("cannot create", parent, e))?;
    }
    let tmp = temp_path(path);
    let written = write_synced(&tmp, &bytes).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| DataError::io("cannot rename", &tmp, e))
    });
    if written.is_err() {
        // Best effort: the error being returned is the useful one.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file =
        std::fs::File::create(path).map_err(|e| DataError::io("cannot create", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| DataError::io("cannot write", path, e))
}

/// `<name>.tmp.<pid>` beside the target, so the rename stays within one file system and two
/// processes caching the same corpus never write the same temporary file.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}

/// Checks every token is below `vocab_size`; `path` names the file in the error, if any.
pub(crate) fn check_tokens(path: Option<&Path>, vocab_size: u32, tokens: &[u32]) -> Result<()> {
    if vocab_size == 0 {
        return Err(DataError::ZeroVocab);
    }
    match tokens.iter().position(|&t| t >= vocab_size) {
        None => Ok(()),
        Some(index) => Err(DataError::TokenOutOfRange {
            path: path.map(Path::to_path_buf),
            index,
            token: tokens[index],
            vocab_size,
        }),
    }
}
