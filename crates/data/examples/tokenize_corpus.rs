//! Measures tokenizing the shipped corpus: loading the GPT-2 ranks, encoding it, and writing and
//! reading (with full validation) the token file. One run, one timing each: a rough number for the
//! report, not a benchmark to compare changes with.
//!
//! Run: `cargo run --release -p data --example tokenize_corpus`

use std::time::Instant;

use data::{read_token_file, shakespeare, write_token_file, Tokenizer};

fn main() {
    let corpus = shakespeare();
    let started = Instant::now();
    let tok = Tokenizer::gpt2();
    tok.encode("warm up");
    let load_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let tokens = tok.encode_corpus(&corpus);
    let encode_s = started.elapsed().as_secs_f64();

    let path = std::env::temp_dir().join(format!("frugal-tokenize-{}.tok", std::process::id()));
    let started = Instant::now();
    write_token_file(&path, tok.vocab_size(), &tokens).expect("write token file");
    let write_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let back = read_token_file(&path).expect("read token file");
    let read_s = started.elapsed().as_secs_f64();
    assert_eq!(back.tokens, tokens);
    let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&path);

    println!(
        "corpus: {} documents, {} bytes",
        corpus.documents.len(),
        corpus.text_bytes()
    );
    println!(
        "tokens: {} ({:.2} bytes/token)",
        tokens.len(),
        corpus.text_bytes() as f64 / tokens.len() as f64
    );
    println!("load r50k ranks: {load_s:.3} s");
    println!("encode corpus: {encode_s:.3} s");
    println!("token file: {file_bytes} bytes, write {write_s:.4} s, read+validate {read_s:.4} s");
}
