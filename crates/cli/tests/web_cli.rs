//! `frugal web` end to end: the API answers the CLI's JSON for the same setups, bad requests get
//! 400 with the CLI's error text and the server keeps serving, and the page, driven by headless
//! Chromium, shows after a knob change the number the API gives (a screenshot is left in
//! `target/web/` for a person to look at).

mod common;

use common::web::Server;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;

/// The CLI's JSON for `flags`, and the API's for the same flags as a query string.
fn both(server: &Server, command: &str, flags: &[&str]) -> (Value, Value) {
    let mut args = vec![command];
    args.extend_from_slice(flags);
    args.push("--json");
    let cli = common::json(&common::frugal(&args));
    let mut query = Vec::new();
    let mut i = 0;
    while i < flags.len() {
        let key = flags[i].trim_start_matches("--");
        if i + 1 < flags.len() && !flags[i + 1].starts_with("--") {
            query.push(format!("{key}={}", flags[i + 1]));
            i += 2;
        } else {
            query.push(format!("{key}=true"));
            i += 1;
        }
    }
    let (status, mut api) = server.json("GET", &format!("/api/{command}?{}", query.join("&")), "");
    assert_eq!(status, 200, "{api}");
    if let Some(o) = api.as_object_mut() {
        o.remove("command");
    }
    (cli, api)
}

#[test]
fn the_api_answers_the_clis_json() {
    let server = Server::start();
    let setups = [
        (
            "plan",
            "--model llama3-8b --train --zero 3 --gpus 8 --batch 4 --seq 2048",
        ),
        (
            "plan",
            "--model gpt2-124m --train --batch 8 --seq 1024 --precision amp-bf16 --recompute full",
        ),
        (
            "plan",
            "--model llama2-7b --infer --weights int4 --kv-dtype fp8 --batch 8 --seq 4096",
        ),
        (
            "plan",
            "--model mistral-7b --infer --seq 32768 --runtime frugal",
        ),
        (
            "plan",
            "--params 7B --train --zero 2 --gpus 8 --convention paper",
        ),
        (
            "fit",
            "--model llama2-7b --gpus 8 --device-memory 80GB --batch 32 --tp 1",
        ),
        ("fit", "--infer --model llama2-70b --device-memory 24GiB"),
    ];
    for (command, flags) in setups {
        let flags: Vec<&str> = flags.split_whitespace().collect();
        let (cli, api) = both(&server, command, &flags);
        assert_eq!(cli, api, "{command} {flags:?}");
    }
    // A pasted config.json plans like the file.
    let dir = common::temp_dir("serve-cli", "config");
    let config = r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 2048}"#;
    let path = dir.join("config.json");
    std::fs::write(&path, config).unwrap();
    let cli = common::json(&common::frugal(&[
        "plan",
        "--model",
        path.to_str().unwrap(),
        "--train",
        "--batch",
        "2",
        "--json",
    ]));
    let (status, api) = server.json("POST", "/api/plan?train=true&batch=2", config);
    assert_eq!(status, 200, "{api}");
    assert_eq!(cli["per_device"], api["per_device"]);
    let (_, models) = server.json("GET", "/api/models", "");
    assert!(models["models"].as_array().unwrap().len() >= 20);
    assert!(models["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "h200"));
}

#[test]
fn bad_requests_get_400_with_the_clis_text_and_the_server_keeps_serving() {
    let server = Server::start();
    let cases = [
        (
            "GET",
            "/api/plan?model=nope&train=true",
            "",
            "unknown model 'nope'",
        ),
        ("GET", "/api/plan?model=llama3-8b&zero=7", "", "--zero"),
        (
            "GET",
            "/api/plan?model=llama3-8b&train=true&tp=3",
            "",
            "--tp",
        ),
        (
            "POST",
            "/api/plan?train=true",
            "{\"model_type\": \"llama\",",
            "not valid JSON",
        ),
        (
            "POST",
            "/api/plan?train=true",
            "{\"model_type\": \"bert\"}",
            "model_type",
        ),
        (
            "GET",
            "/api/plan?model=llama3-8b&batch=999999999999&seq=131072",
            "",
            "overflow",
        ),
        ("GET", "/api/fit?model=llama3-8b&gpus=0", "", "--gpus"),
        // The size ranges the CLI has, tied to the model.
        (
            "GET",
            "/api/plan?model=llama2-7b&seq=1099511627776",
            "",
            "max_position_embeddings",
        ),
        (
            "GET",
            "/api/plan?model=gpt2-124m&infer=true&seq=1000&kv_block=0",
            "",
            "--kv-block: 0",
        ),
        (
            "GET",
            "/api/plan?model=llama2-7b&train=true&lora_rank=100000",
            "",
            "--lora-rank: 100000 exceeds the smaller side",
        ),
        (
            "GET",
            "/api/fit?model=llama2-7b&allow_lora=true&lora_rank=100000",
            "",
            "--lora-rank: 100000 exceeds the smaller side",
        ),
        (
            "GET",
            "/api/fit?model=llama2-7b&lora_rank=8",
            "",
            "--allow-lora",
        ),
        ("GET", "/api/nothing", "", "no such endpoint"),
    ];
    for (method, path, body, want) in cases {
        let (status, v) = server.json(method, path, body);
        assert_eq!(status, 400, "{path}: {v}");
        let text = v["error"].as_str().unwrap();
        assert!(text.contains(want), "{path}: {text}");
    }
    let big = "x".repeat(2 << 20);
    let (status, _) = server.request("POST", "/api/plan?train=true", &big);
    assert_eq!(status, 413);
    let (status, _) = server.request("GET", "/elsewhere", "");
    assert_eq!(status, 404);
    // Still serving.
    let (status, v) = server.json("GET", "/api/plan?model=gpt2-124m&train=true", "");
    assert_eq!(status, 200, "{v}");
}

/// Clients that misbehave hold only their own connection: a body declared at 100 GB is refused
/// unread (413) and the server keeps answering; a client that pipelines thousands of requests
/// without reading the answers, and one that sends headers and then nothing, stall nobody else.
#[test]
fn hostile_clients_do_not_stall_or_kill_the_server() {
    let server = Server::start();
    let mut huge = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        huge,
        "POST /api/plan HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nx"
    )
    .unwrap();
    let mut answer = [0u8; 12];
    huge.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[9..12], b"413");
    let mut flood = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    flood
        .set_write_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let _ = flood.write_all(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(5000));
    let mut silent = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        silent,
        "POST /api/plan HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (status, models) = server.json("GET", "/api/models", "");
    assert_eq!(status, 200, "{models}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "another client waited {:?}",
        started.elapsed()
    );
    drop((huge, flood, silent));
}
