//! Mutated `tokenizer.json` and `tokenizer_config.json` files (a small byte-level BPE as
//! transformers writes one): each loads and encodes and decodes, or fails with an error naming
//! the file; nothing panics.

use data::hf_tokenizer::HfTokenizer;

/// A byte-level BPE over a handful of tokens and one merge, with Llama 3's pre-tokenizer.
const TOKENIZER: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [{"id": 7, "content": "<|end|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
              "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"h": 0, "i": 1, "hi": 2, "Ġ": 3, "a": 4, "b": 5, "!": 6, "<|end|>": 7},
            "merges": ["h i"]}
}"#;

const CONFIG: &str = r#"{"bos_token": "<|end|>", "eos_token": {"content": "<|end|>"},
  "add_bos_token": true, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}"#;

#[test]
fn mutated_tokenizer_files_load_or_fail_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("frugal-tok-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, config) = (
        dir.join("tokenizer.json"),
        dir.join("tokenizer_config.json"),
    );
    // The unmutated pair loads and round-trips.
    std::fs::write(&json, TOKENIZER).unwrap();
    std::fs::write(&config, CONFIG).unwrap();
    let tok = HfTokenizer::from_file(&json).unwrap();
    assert_eq!(tok.encode("hi"), vec![2]);
    let mut m = rng::mutate::Mutator::new(0x746f_6b21);
    let (mut loaded, mut refused) = (0, 0);
    for i in 0..3000 {
        // Mostly the tokenizer, every fourth input its config.
        let (target, base, other, other_text) = match i % 4 {
            3 => (&config, CONFIG, &json, TOKENIZER),
            _ => (&json, TOKENIZER, &config, CONFIG),
        };
        std::fs::write(other, other_text).unwrap();
        std::fs::write(target, m.mutate(base.as_bytes())).unwrap();
        match HfTokenizer::from_file(&json) {
            Ok(t) => {
                loaded += 1;
                let ids = t.encode("hi ab! <|end|>");
                let _ = t.decode(&ids);
            }
            Err(e) => {
                refused += 1;
                let text = e.to_string();
                assert!(text.contains("tokenizer"), "{text}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        loaded > 100 && refused > 100,
        "{loaded} loaded, {refused} refused"
    );
}
