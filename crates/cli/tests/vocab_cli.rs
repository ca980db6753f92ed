//! GGUF vocabularies against llama.cpp's own tokenizer tests: for each of llama.cpp's test
//! vocabularies (SentencePiece `llama` as Llama 2 and Phi-3 ship it; byte-level BPE with the
//! pre-tokenizers of Llama 3, Qwen2, GPT-2 and StarCoder), `frugal tokenize` gives every test
//! text the ids llama.cpp's test file lists for it.

mod common;

use common::{assert_ok, frugal, json, llamacpp_vocab};

/// What a successful run printed.
fn stdout(args: &[&str]) -> String {
    let out = frugal(args);
    assert_ok(&out);
    String::from_utf8(out.stdout).unwrap()
}
use serde_json::Value;

/// The texts of `NAME.gguf.inp` and the ids of `NAME.gguf.out`, one line each.
fn cases(vocab: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let path = vocab.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let inp = read("inp");
    let texts: Vec<&str> = inp
        .strip_suffix("\n__ggml_vocab_test__\n")
        .unwrap_or(&inp)
        .split("\n__ggml_vocab_test__\n")
        .collect();
    let out = read("out");
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert!(
        ids.len() >= texts.len(),
        "{} texts, {} id lines",
        texts.len(),
        ids.len()
    );
    texts.into_iter().map(String::from).zip(ids).collect()
}

#[test]
fn every_test_text_gets_llama_cpps_ids_in_six_vocabularies() {
    for name in [
        "llama-spm",
        "phi-3",
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "starcoder",
    ] {
        let vocab = llamacpp_vocab(name);
        let cases = cases(&vocab);
        assert!(cases.len() >= 40, "{name}: {} cases", cases.len());
        let mut args = vec![
            "tokenize",
            "--model",
            vocab.to_str().unwrap(),
            "--json",
            "--",
        ];
        args.extend(cases.iter().map(|(t, _)| t.as_str()));
        let out = stdout(&args);
        let got: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(got.len(), cases.len(), "{name}");
        for ((text, want), g) in cases.iter().zip(&got) {
            let ids: Vec<u32> = serde_json::from_value(g["ids"].clone()).unwrap();
            assert_eq!(&ids, want, "{name}: {text:?}");
        }
    }
}

#[test]
fn sentencepiece_ids_decode_to_their_text() {
    let vocab = llamacpp_vocab("llama-spm");
    let model = vocab.to_str().unwrap();
    for text in [
        "Hello world",
        "ied 4 ½ months",
        "  two spaces",
        "🦙.cpp\nnew line",
    ] {
        let v = json(&frugal(&[
            "tokenize", "--model", model, "--json", "--", text,
        ]));
        let ids: Vec<String> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.to_string())
            .collect();
        let mut args = vec!["tokenize", "--model", model, "--decode"];
        args.extend(ids.iter().map(String::as_str));
        assert_eq!(stdout(&args).trim_end_matches('\n'), text, "{ids:?}");
    }
}
