//! `frugal web` end to end: the API answers the CLI's JSON for the same setups, bad requests get
//! 400 with the CLI's error text and the server keeps serving, and the page, driven by headless
//! Chromium, shows after a knob change the number the API gives (a screenshot is left in
//! `target/web/` for a person to look at).

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// A running `frugal web` on a free port, stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
            .args(["web", "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start frugal web");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "frugal web: listening on http://127.0.0.1:PORT/ (Ctrl-C to stop)"
        let port = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }

    /// (status, body) of one request.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        // A body over the limit is refused on its declared length, before it is read: the
        // server may answer and close while it is still being sent.
        if body.len() > (1 << 20) {
            let mut head = [0u8; 12];
            s.read_exact(&mut head).expect("an answer before the body");
            let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
            return (status, String::new());
        }
        s.write_all(body.as_bytes()).unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status = raw[9..12].parse().expect("a status code");
        let body = raw.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (status, body)
    }

    fn json(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = self.request(method, path, body);
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let plans: [&[&str]; 5] = [
        &[
            "--model",
            "llama3-8b",
            "--train",
            "--zero",
            "3",
            "--gpus",
            "8",
            "--batch",
            "4",
            "--seq",
            "2048",
        ],
        &[
            "--model",
            "gpt2-124m",
            "--train",
            "--batch",
            "8",
            "--seq",
            "1024",
            "--precision",
            "amp-bf16",
            "--recompute",
            "full",
        ],
        &[
            "--model",
            "llama2-7b",
            "--infer",
            "--weights",
            "int4",
            "--kv-dtype",
            "fp8",
            "--batch",
            "8",
            "--seq",
            "4096",
        ],
        &[
            "--model",
            "mistral-7b",
            "--infer",
            "--seq",
            "32768",
            "--runtime",
            "frugal",
        ],
        &[
            "--params",
            "7B",
            "--train",
            "--zero",
            "2",
            "--gpus",
            "8",
            "--convention",
            "paper",
        ],
    ];
    for flags in plans {
        let (cli, api) = both(&server, "plan", flags);
        assert_eq!(cli, api, "{flags:?}");
    }
    let (cli, api) = both(
        &server,
        "fit",
        &[
            "--model",
            "llama2-7b",
            "--gpus",
            "8",
            "--device-memory",
            "80GB",
            "--batch",
            "32",
            "--tp",
            "1",
        ],
    );
    assert_eq!(cli, api);
    let (cli, api) = both(
        &server,
        "fit",
        &[
            "--infer",
            "--model",
            "llama2-70b",
            "--device-memory",
            "24GiB",
        ],
    );
    assert_eq!(cli, api);
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
            "/api/plan?model=llama3-8b&batch=999999999999&seq=99999999",
            "",
            "overflow",
        ),
        ("GET", "/api/fit?model=llama3-8b&gpus=0", "", "--gpus"),
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

fn find_chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Headless Chromium: Debian's `chromium`, which `.ci/run` installs; on a fresh machine where
/// this runs as root with apt, the test installs it itself (the README's test command does all
/// the set-up).
fn chromium() -> &'static str {
    if let Some(c) = find_chromium() {
        return c;
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if root {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        let _ = apt(&["update"]) && apt(&["install", "-y", "chromium"]);
    }
    find_chromium().unwrap_or_else(|| {
        panic!(
            "the browser test needs headless Chromium: apt-get install chromium (.ci/run installs it)"
        )
    })
}

#[test]
fn the_page_shows_what_the_api_says_after_a_knob_changes() {
    let server = Server::start();
    let browser = chromium();
    let page = |query: &str| format!("http://127.0.0.1:{}/?{query}", server.port);
    let headless = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
    ];
    // Load llama3.1-8b on 8 GPUs at ZeRO-3, then switch the ZeRO select to 2 as a person would.
    let url = page("model=llama3.1-8b&gpus=8&zero=3&batch=4&then=zero:2");
    let out = Command::new(browser)
        .args(headless)
        .args(["--dump-dom", &url])
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let shown: u64 = dom
        .split("data-bytes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no total on the page:\n{dom}"));
    assert!(
        dom.contains("data-updates=\"2\""),
        "the knob change re-planned:\n{dom}"
    );
    let command = dom
        .split("id=\"command\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("the command on the page");
    assert!(command.contains("--zero 2"), "{command}");
    // The API for the same knobs, and the CLI for the command the page shows.
    let q =
        "model=llama3.1-8b&train=true&gpus=8&zero=2&batch=4&seq=2048&gpu=h100&device-memory=80GiB";
    let (_, api) = server.json("GET", &format!("/api/plan?{q}"), "");
    assert_eq!(shown, api["per_device"]["total_bytes"].as_u64().unwrap());
    let mut words: Vec<&str> = command.split_whitespace().skip(1).collect();
    words.push("--json");
    let cli = common::json(&common::frugal(&words));
    assert_eq!(shown, cli["per_device"]["total_bytes"].as_u64().unwrap());
    // A bad knob shows the CLI's error next to its field.
    let bad = page("model=llama3.1-8b&tp=3");
    let out = Command::new(browser)
        .args(headless)
        .args(["--dump-dom", &bad])
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("class=\"err live\"") && dom.contains("--tp"),
        "{dom}"
    );
    // A screenshot for a person to look at.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/web");
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("plan.png");
    let out = Command::new(browser)
        .args(headless)
        .args([
            "--window-size=1400,1500",
            &format!("--screenshot={}", shot.display()),
            &page("model=llama3.1-8b&gpus=8&zero=3&batch=4"),
        ])
        .output()
        .unwrap();
    common::assert_ok(&out);
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot of the page"
    );
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
