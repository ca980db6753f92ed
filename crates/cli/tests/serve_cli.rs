//! `frugal serve` over HTTP with no Python: the OpenAI API on SmolLM2-135M-Instruct (the GGUF
//! the real-model tests fetch), answers equal to `frugal generate`'s, streamed and whole, the
//! chat template applied, and clients that misbehave answered with the API's errors.

mod common;

use common::served::Served;
use common::{frugal, json, smollm2};
use serde_json::Value;
use std::process::Command;

#[test]
fn the_openai_api_answers_as_generate_does_whole_and_streamed() {
    let model = smollm2();
    // The f32 values (the chat below answers "Paris" on them; on the file's own blocks, as on
    // llama.cpp, it does not).
    let server = Served::start_with(&model, &["--weights", "f32"]);
    let greedy = r#"{"prompt": "The three primary colors are", "max_tokens": 12, "temperature": 0"#;
    let (status, whole) = server.post("/v1/completions", &format!("{greedy}}}"));
    assert_eq!(status, 200, "{whole}");
    let whole: Value = serde_json::from_str(&whole).unwrap();
    let text = whole["choices"][0]["text"].as_str().unwrap();
    // `frugal generate`'s answer to the same prompt, 12 tokens on the f32 values.
    let generate = |extra: &[&str]| {
        let prompt = "The three primary colors are";
        let mut args = common::generate_args(model.to_str().unwrap(), prompt, "12", &[]);
        args.extend(["--weights", "f32", "--json"]);
        args.extend_from_slice(extra);
        json(&frugal(&args))
    };
    let generated = generate(&[]);
    assert_eq!(text, generated["text"].as_str().unwrap());
    assert_eq!(whole["usage"]["completion_tokens"], 12);
    // Sampled with a seed, in the nucleus: the same draws as generate's.
    let sampled = r#"{"prompt": "The three primary colors are", "max_tokens": 12,
        "temperature": 0.8, "top_p": 0.9, "seed": 7}"#;
    let (status, answer) = server.post("/v1/completions", sampled);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    let drawn = generate(&["--temperature", "0.8", "--top-p", "0.9", "--seed", "7"]);
    assert_eq!(answer["choices"][0]["text"], drawn["text"]);
    assert_ne!(
        drawn["text"], generated["text"],
        "a draw, not the greedy text"
    );
    // Log-probabilities: each greedy token is its step's likeliest (the entries hold the chosen
    // token and the two likeliest), and the tokens spell the text.
    let (status, lp) = server.post("/v1/completions", &format!("{greedy}, \"logprobs\": 2}}"));
    assert_eq!(status, 200, "{lp}");
    let lp: Value = serde_json::from_str(&lp).unwrap();
    let l = &lp["choices"][0]["logprobs"];
    let tokens: Vec<&str> = (l["tokens"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), text);
    let mut at = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(l["text_offset"][i], at, "{l}");
        at += t.chars().count();
        let chosen = l["token_logprobs"][i].as_f64().unwrap();
        let top = l["top_logprobs"][i].as_object().unwrap();
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(chosen <= 0.0 && chosen == best, "{chosen} {top:?}");
        assert_eq!(top.len(), 2, "greedy: the chosen token is one of the two");
    }
    // The chat layout, streamed: each chunk's entries are that chunk's tokens; the usage last.
    let chat = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
        "temperature": 0, "logprobs": true, "top_logprobs": 1, "stream": true,
        "stream_options": {"include_usage": true}}"#;
    let (status, sse) = server.post("/v1/chat/completions", chat);
    assert_eq!(status, 200, "{sse}");
    let chunks: Vec<Value> = (sse.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (mut said, mut entries) = (String::new(), String::new());
    for c in &chunks[..chunks.len() - 1] {
        said.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        for t in c["choices"][0]["logprobs"]["content"].as_array().unwrap() {
            entries.push_str(t["token"].as_str().unwrap());
            assert_eq!(t["top_logprobs"][0]["logprob"], t["logprob"], "greedy: {t}");
        }
    }
    assert_eq!(entries, said);
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], serde_json::json!([]), "{usage}");
    assert_eq!(usage["usage"]["completion_tokens"], 6, "{usage}");
    // Streamed: the same text in pieces, then [DONE].
    let (status, sse) = server.post("/v1/completions", &format!("{greedy}, \"stream\": true}}"));
    assert_eq!(status, 200);
    let events: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{sse}");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    // Chat: the model's template, an answer, a stop at the end of the turn.
    let chat = r#"{"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 40}"#;
    let (status, answer) = server.post("/v1/chat/completions", chat);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("Paris"), "{content}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
}

#[test]
fn misbehaving_clients_get_the_apis_errors_and_the_server_goes_on() {
    let model = smollm2();
    let server = Served::start(&model);
    let cases = [
        ("/v1/completions", "not json", 400, "not JSON"),
        (
            "/v1/completions",
            r#"{"max_tokens": 4}"#,
            400,
            "prompt must be a string",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "max_tokens": 100000}"#,
            400,
            "context is 512",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "top_p": 1.5}"#,
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "logprobs": 21}"#,
            400,
            "logprobs must be an integer from 0 to 20",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}"#,
            400,
            "top_logprobs needs logprobs: true",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "stream": "yes"}"#,
            400,
            "stream must be true or false",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "stream_options": {"include_usage": true}}"#,
            400,
            "stream_options needs stream: true",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "stream": true, "stream_options": {"continuous": true}}"#,
            400,
            "stream_options.continuous is not supported",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "top_k": 1.5}"#,
            400,
            "top_k",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "max_tokens": 18446744073709551615}"#,
            400,
            "context is 512",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "temperature": 9}"#,
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user"}]}"#,
            400,
            "content",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "temperature": -1}"#,
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "max_tokens": 1000000000}"#,
            400,
            "context is 512",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "temprature": 0}"#,
            400,
            "unknown field temprature",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "a", "presence_penalty": 1}"#,
            400,
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}"#,
            404,
            "not served here",
        ),
        ("/v1/elsewhere", "{}", 404, "no such endpoint"),
    ];
    for (path, body, want, needle) in cases {
        let (status, text) = server.post(path, body);
        assert_eq!(status, want, "{path} {body}: {text}");
        assert!(text.contains(needle), "{path} {body}: {text}");
    }
    // A body declared past 1 MiB is refused before any of it is read: the answer comes while
    // the client has sent only the headers.
    for declared in ["2097152", "99999999999"] {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(&answer[9..12], "413", "{answer}");
        assert!(answer.contains("limited to 1048576 bytes"), "{answer}");
    }
    // A client that asks for a long stream and leaves: the engine drops its job at the next
    // token, and the next request is answered at once.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let body = r#"{"prompt": "Once upon a time", "max_tokens": 480, "stream": true}"#;
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut first = [0u8; 64];
        s.read_exact(&mut first).unwrap();
    }
    let started = std::time::Instant::now();
    let (status, _) = server.post("/v1/completions", r#"{"prompt": "Hi", "max_tokens": 2}"#);
    assert_eq!(status, 200);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // The client that left was cancelled and its blocks are back in the pool.
    assert_eq!(
        server.metric("frugal_requests_total{finish=\"cancelled\"}"),
        1.0
    );
    assert_eq!(server.metric("frugal_kv_blocks_used"), 0.0);
    assert!(server.metric("frugal_kv_blocks_free") > 0.0);
}

/// 16 clients at once share the continuous batch (4 decoded together), and each gets, streamed,
/// the greedy answer it gets alone; `/metrics` counts the tokens and ends with no request
/// running and every KV block free.
#[test]
fn concurrent_clients_share_one_batch_and_each_gets_its_own_answer() {
    let model = smollm2();
    let server = Served::start_with(&model, &["--max-seqs", "4"]);
    let prompts: Vec<String> = (0..16)
        .map(|i| format!("Question {i}: what is {} plus {}? Answer:", i * 7, i + 3))
        .collect();
    let body = |p: &str, stream: bool| {
        serde_json::json!({"prompt": p, "max_tokens": 10, "temperature": 0, "stream": stream})
            .to_string()
    };
    let text_of = |reply: &str| -> String {
        if let Ok(v) = serde_json::from_str::<Value>(reply) {
            return v["choices"][0]["text"].as_str().unwrap().to_string();
        }
        reply
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .map(|e| {
                serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let mut tokens = 0;
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, reply) = server.post("/v1/completions", &body(p, false));
            assert_eq!(status, 200, "{reply}");
            let v: Value = serde_json::from_str(&reply).unwrap();
            tokens += v["usage"]["completion_tokens"].as_u64().unwrap();
            text_of(&reply)
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (server, body) = (&server, body(p, true));
                scope.spawn(move || {
                    let (status, reply) = server.post("/v1/completions", &body);
                    assert_eq!(status, 200, "{reply}");
                    reply
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| text_of(&h.join().unwrap()))
            .collect()
    });
    assert_eq!(together, alone);
    assert_eq!(
        server.metric("frugal_generated_tokens_total"),
        2.0 * tokens as f64
    );
    assert_eq!(server.metric("frugal_requests_running"), 0.0);
    assert_eq!(server.metric("frugal_kv_blocks_used"), 0.0);
    assert_eq!(server.metric("frugal_requests_waiting"), 0.0);
    assert_eq!(
        server.metric("frugal_time_to_first_token_seconds_count"),
        32.0
    );
}

/// SIGTERM while a request runs: it is answered in full, then the server exits 0.
#[test]
fn sigterm_answers_what_runs_then_exits() {
    let model = smollm2();
    let mut server = Served::start_with(&model, &[]);
    let port = server.port;
    let client = std::thread::spawn(move || {
        let s = Served {
            child: Command::new("true").spawn().unwrap(),
            port,
        };
        s.post(
            "/v1/completions",
            r#"{"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}"#,
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (status, reply) = client.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    let v: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 64, "{reply}");
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// 200 requests from 32 concurrent clients against a queue of 8: every one is answered, with
/// text or with a 429 the client retries after; none is lost, and the pool ends empty.
#[test]
fn two_hundred_requests_from_32_clients_none_lost() {
    let model = smollm2();
    let server = Served::start_with(&model, &["--max-seqs", "4", "--queue", "8"]);
    let per_client = 200 / 32 + 1;
    let results: Vec<(u32, u32)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|c| {
                let server = &server;
                scope.spawn(move || {
                    let (mut answered, mut busy) = (0, 0);
                    for i in 0..per_client {
                        if c * per_client + i >= 200 {
                            break;
                        }
                        let body = format!(
                            r#"{{"prompt": "Client {c} asks {i}:", "max_tokens": 3, "temperature": 0}}"#
                        );
                        loop {
                            let (status, reply) = server.post("/v1/completions", &body);
                            match status {
                                200 => {
                                    let v: Value = serde_json::from_str(&reply).unwrap();
                                    assert!(v["choices"][0]["text"].is_string(), "{reply}");
                                    answered += 1;
                                    break;
                                }
                                429 => {
                                    assert!(reply.contains("retry"), "{reply}");
                                    busy += 1;
                                    std::thread::sleep(std::time::Duration::from_millis(50));
                                }
                                other => panic!("{other}: {reply}"),
                            }
                        }
                    }
                    (answered, busy)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let answered: u32 = results.iter().map(|r| r.0).sum();
    assert_eq!(answered, 200);
    let finished = server.metric("frugal_requests_total{finish=\"length\"}")
        + server.metric("frugal_requests_total{finish=\"stop\"}");
    assert_eq!(finished, 200.0);
    assert_eq!(
        server.metric("frugal_requests_total{finish=\"error\"}"),
        0.0
    );
    assert_eq!(server.metric("frugal_kv_blocks_used"), 0.0);
    assert_eq!(server.metric("frugal_requests_waiting"), 0.0);
}

/// `bench serve --http` drives a `frugal serve` it starts with the seeded trace: every request
/// answered with the trace's length (`ignore_eos`), latencies reported, the server stopped.
#[test]
fn bench_serve_over_http_reports_latencies() {
    let model = smollm2();
    let trace = common::Trace {
        requests: "6",
        prompt_mean: "8",
        output_mean: "6",
    };
    let extra = ["--max-seqs", "3", "--json"];
    let out = frugal(&common::bench_serve_http(
        model.to_str().unwrap(),
        trace,
        &extra,
    ));
    let v = json(&out);
    assert_eq!(v["requests"], 6);
    assert!(v["generated_tokens"].as_u64().unwrap() >= 6);
    assert!(v["text_pieces"].as_u64().unwrap() >= 6);
    for key in [
        "throughput_tokens_per_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p99_s",
    ] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    // Paged blocks waste at most a partly filled block a request; contiguous caches the context.
    if v["kv_waste_samples"].as_u64().unwrap() > 0 {
        let paged = v["kv_waste_fraction"].as_f64().unwrap();
        assert!(
            (0.0..1.0).contains(&paged) && paged < v["contiguous_waste_fraction"].as_f64().unwrap()
        );
    }
}
