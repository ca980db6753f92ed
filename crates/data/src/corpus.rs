//! Text corpora: a list of named documents, and the shipped Shakespeare corpus embedded in the binary
//! so `frugal train` works from any directory on a fresh clone.
//!
//! This file does no IO: reading text from disk is in `text_files.rs`, tokenizing in `tokenizer.rs`.
//!
//! ```
//! let corpus = data::shakespeare();
//! assert_eq!(corpus.documents.len(), 8);
//! assert!(data::shakespeare_text().contains("To be, or not to be"));
//! ```

use std::borrow::Cow;
use std::sync::OnceLock;

/// One document of a corpus: a play, a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// A short name: the file stem for loaded files, the play for the shipped corpus.
    pub name: String,
    /// The UTF-8 text. Borrowed for the embedded corpus, owned for loaded files.
    pub text: Cow<'static, str>,
}

/// A named list of documents, in a fixed order (the order tokens are laid out in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus {
    /// What the corpus is called: `shakespeare`, or the loaded path's file name.
    pub name: String,
    pub documents: Vec<Document>,
}

impl Corpus {
    /// Total length of all documents' text in bytes (without separators).
    pub fn text_bytes(&self) -> u64 {
        self.documents.iter().map(|d| d.text.len() as u64).sum()
    }

    /// A 64-bit FNV-1a hash over the documents' names and texts, used to name token caches so a
    /// changed corpus is never read from a stale cache.
    pub fn fingerprint(&self) -> u64 {
        let mut hash = Fnv1a64::new();
        for doc in &self.documents {
            // Lengths before contents keep ("ab","c") and ("a","bc") apart.
            hash.write(&(doc.name.len() as u64).to_le_bytes());
            hash.write(doc.name.as_bytes());
            hash.write(&(doc.text.len() as u64).to_le_bytes());
            hash.write(doc.text.as_bytes());
        }
        hash.finish()
    }
}

/// The separator between plays in [`shakespeare_text`].
pub const DOCUMENT_SEPARATOR: &str = "\n\n";

/// The shipped plays, in the fixed order they are laid out in (alphabetical by file name).
pub const SHAKESPEARE_PLAYS: [(&str, &str); 8] = [
    (
        "hamlet",
        include_str!("../../../data/shakespeare/hamlet.txt"),
    ),
    (
        "julius_caesar",
        include_str!("../../../data/shakespeare/julius_caesar.txt"),
    ),
    ("lear", include_str!("../../../data/shakespeare/lear.txt")),
    (
        "macbeth",
        include_str!("../../../data/shakespeare/macbeth.txt"),
    ),
    (
        "midsummer_nights_dream",
        include_str!("../../../data/shakespeare/midsummer_nights_dream.txt"),
    ),
    (
        "othello",
        include_str!("../../../data/shakespeare/othello.txt"),
    ),
    (
        "romeo_and_juliet",
        include_str!("../../../data/shakespeare/romeo_and_juliet.txt"),
    ),
    (
        "tempest",
        include_str!("../../../data/shakespeare/tempest.txt"),
    ),
];

/// The shipped corpus: eight plays (Project Gutenberg texts), one document each.
pub fn shakespeare() -> Corpus {
    Corpus {
        name: "shakespeare".to_string(),
        documents: SHAKESPEARE_PLAYS
            .iter()
            .map(|(name, text)| Document {
                name: (*name).to_string(),
                text: Cow::Borrowed(*text),
            })
            .collect(),
    }
}

/// The shipped corpus as one string: the plays in order joined by [`DOCUMENT_SEPARATOR`].
/// Built once on first use (the plays are embedded once, not twice).
pub fn shakespeare_text() -> &'static str {
    static JOINED: OnceLock<String> = OnceLock::new();
    JOINED.get_or_init(|| {
        SHAKESPEARE_PLAYS
            .iter()
            .map(|(_, text)| *text)
            .collect::<Vec<_>>()
            .join(DOCUMENT_SEPARATOR)
    })
}

/// FNV-1a, 64 bit: tiny, dependency-free, and good enough to tell corpora apart (not for security).
struct Fnv1a64(u64);

impl Fnv1a64 {
    fn new() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_corpus_has_eight_nonempty_plays_in_fixed_order() {
        let corpus = shakespeare();
        let names: Vec<&str> = corpus.documents.iter().map(|d| d.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), 8);
        assert!(corpus.documents.iter().all(|d| d.text.len() > 90_000));
        assert!(corpus.text_bytes() > 1_000_000);
    }

    #[test]
    fn joined_text_is_plays_with_separators() {
        let corpus = shakespeare();
        let expected = corpus.text_bytes() as usize + DOCUMENT_SEPARATOR.len() * 7;
        assert_eq!(shakespeare_text().len(), expected);
        assert!(shakespeare_text().starts_with(SHAKESPEARE_PLAYS[0].1));
        assert!(shakespeare_text().ends_with(SHAKESPEARE_PLAYS[7].1));
    }

    #[test]
    fn fingerprint_changes_with_text_and_boundaries() {
        let doc = |name: &str, text: &str| Document {
            name: name.to_string(),
            text: Cow::Owned(text.to_string()),
        };
        let corpus = |docs: Vec<Document>| Corpus {
            name: "c".to_string(),
            documents: docs,
        };
        let a = corpus(vec![doc("x", "ab"), doc("y", "c")]);
        let b = corpus(vec![doc("x", "a"), doc("y", "bc")]);
        let c = corpus(vec![doc("x", "ab"), doc("y", "d")]);
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
    }
}
