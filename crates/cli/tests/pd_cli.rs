//! Prefill/decode disaggregation from the CLI on a real model (SmolLM2-135M): a prefill worker
//! runs each prompt and ships its KV to the decode worker; the answers equal one worker's, the
//! bytes shipped per request equal the plan's KV for the prompt, and the refusals.

mod common;

use common::served::Served;
use common::{fails_with, frugal, json, smollm2};

/// `frugal generate`'s greedy text for `prompt`: what a server must answer.
fn alone(model: &str, prompt: &str, tokens: usize) -> String {
    let tokens = tokens.to_string();
    let v = json(&frugal(&common::generate_args(
        model,
        prompt,
        &tokens,
        &["--json"],
    )));
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn a_disaggregated_server_answers_as_one_worker_and_ships_the_plans_kv() {
    let model = smollm2();
    let m = model.to_str().unwrap();
    // Two workers on one core: a worker waiting for work holds none of its pool.
    let server = Served::start_with(&model, &["--prefill-ranks", "2", "--prefill-threads", "1"]);
    let prompts = [
        "The history of Rome",
        "Water boils at",
        "My favourite book is",
    ];
    let answers = server.complete_all(&prompts, 16);
    // What the plan says one token's KV is, over every layer.
    let plan = json(&frugal(&[
        "plan",
        "--model",
        m,
        "--infer",
        "--runtime",
        "frugal",
        "--seq",
        "64",
        "--batch",
        "1",
        "--weights",
        "f32",
        "--kv-dtype",
        "f32",
        "--json",
    ]));
    let per_token = plan["inference"]["kv_bytes_per_token"].as_u64().unwrap();
    let mut planned = 0;
    for (p, got) in prompts.iter().zip(&answers) {
        let text = got["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text, alone(m, p, 16), "{p}");
        // Whole blocks of 16 tokens hold the prompt.
        let prompt = got["usage"]["prompt_tokens"].as_u64().unwrap();
        planned += prompt.div_ceil(16) * 16 * per_token;
    }
    assert_eq!(server.metric("frugal_kv_shipments_total"), 3.0);
    // The first token is sampled where the prompt ran, without its logits here.
    let (status, refused) = server.post("/v1/completions", r#"{"prompt": "a", "logprobs": 1}"#);
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("prefill workers"), "{refused}");
    assert_eq!(
        server.metric("frugal_kv_shipped_bytes_total"),
        planned as f64
    );
    assert_eq!(server.metric("frugal_kv_blocks_used"), 0.0);
}

#[test]
fn two_decode_workers_share_the_requests_and_answer_as_one_worker() {
    let model = smollm2();
    let m = model.to_str().unwrap();
    let prompts = [
        "The history of Rome",
        "Water boils at",
        "My favourite book is",
        "ROMEO:",
    ];
    let alone: Vec<String> = prompts.iter().map(|p| alone(m, p, 12)).collect();
    // Two engines on their own (each its own weights and KV pool), then fed by one prefill rank.
    for extra in [
        &["--decode-ranks", "2"][..],
        &[
            "--decode-ranks",
            "2",
            "--prefill-ranks",
            "1",
            "--prefill-threads",
            "1",
        ],
    ] {
        let server = Served::start_with(&model, extra);
        let answers = server.complete_all(&prompts, 12);
        for ((p, got), want) in prompts.iter().zip(&answers).zip(&alone) {
            let text = got["choices"][0]["text"].as_str().unwrap();
            assert_eq!(text, want, "{p} with {extra:?}");
        }
        let admitted = |e: &str| {
            let name = format!("frugal_engine_requests_admitted_total{{engine=\"{e}\"}}");
            server.metric(&name)
        };
        let (first, second) = (admitted("0"), admitted("1"));
        assert_eq!(first + second, 4.0, "{extra:?}");
        assert!(
            first > 0.0 && second > 0.0,
            "both engines admit: {first} {second}"
        );
        assert_eq!(server.metric("frugal_kv_blocks_used"), 0.0);
        assert_eq!(server.metric("frugal_requests_running"), 0.0);
    }
}

#[test]
fn bench_serve_compares_disaggregated_serving_over_http() {
    let model = smollm2();
    let trace = common::Trace {
        requests: "4",
        prompt_mean: "64",
        output_mean: "8",
    };
    let extra = [
        "--context",
        "256",
        "--max-seqs",
        "2",
        "--prefill-ranks",
        "1",
        "--json",
    ];
    let args = common::bench_serve_http(model.to_str().unwrap(), trace, &extra);
    let out = json(&frugal(&args));
    assert_eq!(out["prefill_ranks"], 1);
    assert!(out["kv_shipped_bytes"].as_u64().unwrap() > 0, "{out}");
    assert!(out["tpot_p99_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn disaggregation_is_refused_where_it_does_not_apply() {
    let model = smollm2();
    let m = model.to_str().unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--model", m, "--port", "0"];
        args.extend_from_slice(extra);
        frugal(&args)
    };
    fails_with(
        &serve(&["--prefill-ranks", "1", "--tp", "3"]),
        "use one of the two",
    );
    fails_with(
        &serve(&["--prefill-ranks", "1", "--prefill-threads", "0"]),
        "--prefill-threads 0",
    );
    fails_with(&serve(&["--prefill-ranks", "100"]), "1 to 64 prefill ranks");
    fails_with(&serve(&["--decode-ranks", "0"]), "1 to 64 decode workers");
    fails_with(
        &serve(&["--decode-ranks", "2", "--tp", "3"]),
        "use one of the two",
    );
    fails_with(
        &serve(&["--comm", "mpi", "--decode-ranks", "2"]),
        "--decode-ranks 2 with --comm mpi",
    );
    fails_with(&serve(&["--prefill-threads", "1"]), "give both");
    // MPI processes run one kind of rank, each on its launcher's cores.
    fails_with(
        &serve(&["--comm", "mpi", "--prefill-ranks", "1", "--tp", "2"]),
        "use one of the two",
    );
    #[cfg(not(feature = "mpi"))]
    fails_with(&serve(&["--comm", "mpi"]), "--features mpi");
    fails_with(
        &serve(&[
            "--comm",
            "mpi",
            "--prefill-ranks",
            "1",
            "--prefill-threads",
            "1",
        ]),
        "--prefill-threads",
    );
    fails_with(
        &frugal(&["bench", "serve", "--prefill-ranks", "1"]),
        "add --http",
    );
}
