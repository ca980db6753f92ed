//! The binary token file and the token cache: round trips, and every kind of damaged file rejected
//! with the error that names what is wrong.

use std::path::{Path, PathBuf};

use data::{
    decode_token_file, encode_token_file, load_or_tokenize, read_token_file, write_token_file,
    Corpus, DataError, Document, Tokenizer, GPT2_VOCAB_SIZE, TOKEN_FILE_HEADER_BYTES,
};

/// A fresh, empty folder under the system temp dir, unique per test.
fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("frugal-data-tok-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Tokens of a slice of the shipped corpus: real ids, spread over the vocabulary.
fn sample_tokens() -> Vec<u32> {
    Tokenizer::gpt2().encode(&data::shakespeare_text()[..20_000])
}

#[test]
fn file_round_trip_u16_and_u32_widths() {
    let dir = scratch_dir("round_trip");
    let tokens = sample_tokens();
    let path = dir.join("nested/more/corpus.tok");
    write_token_file(&path, GPT2_VOCAB_SIZE, &tokens).unwrap();
    let file = read_token_file(&path).unwrap();
    assert_eq!((file.vocab_size, &file.tokens), (GPT2_VOCAB_SIZE, &tokens));
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    assert_eq!(len, TOKEN_FILE_HEADER_BYTES + 2 * tokens.len());
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(names.len(), 1);

    // A vocabulary past u16 stores 4-byte tokens.
    let wide = [0, 65_535, 65_536, 99_999];
    let bytes = encode_token_file(100_000, &wide).unwrap();
    assert_eq!(bytes.len(), TOKEN_FILE_HEADER_BYTES + 16);
    assert_eq!(
        decode_token_file(Path::new("w.tok"), &bytes)
            .unwrap()
            .tokens,
        wide
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bit_flip_in_payload_fails_the_checksum() {
    let mut bytes = encode_token_file(GPT2_VOCAB_SIZE, &sample_tokens()).unwrap();
    bytes[TOKEN_FILE_HEADER_BYTES + 101] ^= 0x04;
    let err = decode_token_file(Path::new("flip.tok"), &bytes).unwrap_err();
    assert!(matches!(err, DataError::ChecksumMismatch { .. }), "{err}");
    assert!(err.to_string().contains("flip.tok"), "{err}");
}

#[test]
fn truncated_and_padded_files_fail_the_length_check() {
    let bytes = encode_token_file(GPT2_VOCAB_SIZE, &sample_tokens()).unwrap();
    let n = bytes.len() as u64;
    for cut in [
        &bytes[..bytes.len() - 1],
        &bytes[..TOKEN_FILE_HEADER_BYTES],
        &bytes[..20],
    ] {
        let err = decode_token_file(Path::new("cut.tok"), cut).unwrap_err();
        assert!(
            matches!(err, DataError::LengthMismatch { actual_bytes, .. } if actual_bytes == cut.len() as u64),
            "{err}"
        );
    }
    let mut padded = bytes.clone();
    padded.push(0);
    let err = decode_token_file(Path::new("pad.tok"), &padded).unwrap_err();
    assert!(
        matches!(err, DataError::LengthMismatch { expected_bytes, .. } if expected_bytes == n),
        "{err}"
    );
    // A corrupted count that would overflow a u64 size is a length error too, not a panic.
    let mut huge = bytes.clone();
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = decode_token_file(Path::new("huge.tok"), &huge).unwrap_err();
    assert!(matches!(err, DataError::LengthMismatch { .. }), "{err}");
}

#[test]
fn wrong_magic_and_version_are_rejected() {
    let bytes = encode_token_file(GPT2_VOCAB_SIZE, &[1, 2, 3]).unwrap();
    let mut magic = bytes.clone();
    magic[..8].copy_from_slice(b"GGUF\0\0\0\0");
    let err = decode_token_file(Path::new("m.tok"), &magic).unwrap_err();
    assert!(matches!(err, DataError::BadMagic { .. }), "{err}");
    let err = decode_token_file(Path::new("short.tok"), b"FRUG").unwrap_err();
    assert!(matches!(err, DataError::BadMagic { .. }), "{err}");

    let mut version = bytes;
    version[8..12].copy_from_slice(&2u32.to_le_bytes());
    let err = decode_token_file(Path::new("v.tok"), &version).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tokens_beyond_the_vocabulary_are_rejected_on_read_and_write() {
    // Writing refuses to store an invalid id.
    let err = encode_token_file(100, &[5, 99, 100]).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TokenOutOfRange {
                index: 2,
                token: 100,
                vocab_size: 100,
                ..
            }
        ),
        "{err}"
    );
    // A file whose checksum is right but whose header vocabulary is too small for its ids (as if
    // written by another tokenizer) is rejected with the file, index and id.
    let mut bytes = encode_token_file(GPT2_VOCAB_SIZE, &[5, 99, 50_000]).unwrap();
    bytes[12..16].copy_from_slice(&1000u32.to_le_bytes());
    let err = decode_token_file(Path::new("ids.tok"), &bytes).unwrap_err();
    match &err {
        DataError::TokenOutOfRange {
            path,
            index,
            token,
            vocab_size,
        } => {
            assert_eq!(path.as_deref(), Some(Path::new("ids.tok")));
            assert_eq!((*index, *token, *vocab_size), (2, 50_000, 1000));
        }
        other => panic!("expected TokenOutOfRange, got {other}"),
    }
    assert!(err.to_string().contains("ids.tok"));
}

fn small_corpus(text: &str) -> Corpus {
    Corpus {
        name: "small/corpus".to_string(),
        documents: vec![Document {
            name: "a".to_string(),
            text: text.to_string().into(),
        }],
    }
}

#[test]
fn cache_writes_once_then_reads_and_detects_corruption() {
    let dir = scratch_dir("cache");
    let tok = Tokenizer::gpt2();
    let corpus = small_corpus(&data::shakespeare_text()[..5_000]);
    let first = load_or_tokenize(&corpus, &tok, &dir).unwrap();
    assert!(!first.from_cache);
    assert!(first.path.starts_with(&dir));
    let second = load_or_tokenize(&corpus, &tok, &dir).unwrap();
    assert!(second.from_cache);
    assert_eq!(first.tokens, second.tokens);
    assert_eq!(first.tokens, tok.encode_corpus(&corpus));

    // A changed corpus gets its own file, never the stale one.
    let other = load_or_tokenize(&small_corpus("different text"), &tok, &dir).unwrap();
    assert!(!other.from_cache);
    assert_ne!(other.path, first.path);

    // A damaged cache is an error naming it, not a silent re-tokenize.
    let mut bytes = std::fs::read(&first.path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&first.path, &bytes).unwrap();
    let err = load_or_tokenize(&corpus, &tok, &dir).unwrap_err();
    assert!(matches!(err, DataError::ChecksumMismatch { .. }), "{err}");
    assert!(err.to_string().contains("delete it"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_for_another_vocabulary_is_rejected() {
    let dir = scratch_dir("vocab");
    let tok = Tokenizer::gpt2();
    let corpus = small_corpus("a few words");
    let path = data::cache_path(&corpus, &tok, &dir);
    write_token_file(&path, 60_000, &[1, 2, 3]).unwrap();
    let err = load_or_tokenize(&corpus, &tok, &dir).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::VocabMismatch {
                found: 60_000,
                expected: 50_257,
                ..
            }
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn empty_corpus_is_an_error_and_writes_nothing() {
    let dir = scratch_dir("empty");
    let err = load_or_tokenize(&small_corpus(""), &Tokenizer::gpt2(), &dir).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
