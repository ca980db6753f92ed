//! The shipped corpus end to end: the whole of it tokenizes and decodes back to the same text.
//! This is the one test that tokenizes all ~1 MB (0.6 s measured, dev profile, 2 busy cores).

use data::{shakespeare, Tokenizer, DOCUMENT_SEPARATOR, EOT, GPT2_VOCAB_SIZE};

#[test]
fn whole_corpus_round_trips_with_eot_between_plays() {
    let tok = Tokenizer::gpt2();
    let corpus = shakespeare();
    let tokens = tok.encode_corpus(&corpus);
    assert!(tokens.iter().all(|&t| t < GPT2_VOCAB_SIZE));
    assert_eq!(
        tokens.iter().filter(|&&t| t == EOT).count(),
        corpus.documents.len() - 1
    );
    let plays: Vec<&[u32]> = tokens.split(|&t| t == EOT).collect();
    for (play, doc) in plays.iter().zip(&corpus.documents) {
        assert_eq!(tok.decode(play).unwrap(), doc.text, "{}", doc.name);
    }
    // Decoding the whole stream gives the texts with "<|endoftext|>" where the separators were.
    let joined: Vec<&str> = corpus.documents.iter().map(|d| d.text.as_ref()).collect();
    assert_eq!(tok.decode(&tokens).unwrap(), joined.join("<|endoftext|>"));
    assert_ne!(DOCUMENT_SEPARATOR, "<|endoftext|>");
}
