//! `frugal web`: the planner in a browser. One self-contained page (HTML, CSS and JS embedded
//! in the binary: no CDN, no network) and a JSON API that is the CLI's JSON, field for field.
//!
//! The API turns a query string into the CLI's own flags (`zero=3` is `--zero 3`, `train=true`
//! is `--train`) and parses them with the same clap definitions, so its answers and its errors
//! are `frugal plan --json`'s and `frugal fit --json`'s: `GET /api/plan?…`, `GET /api/fit?…`,
//! `POST` to either with a pasted HF config.json as the body, `GET /api/models` (presets and GPUs).
//! A bad request answers 400 with the CLI's error text; a request never panics the server (each
//! is answered inside `catch_unwind`), bodies are bounded before they are read ([`MAX_BODY`]),
//! and each connection is its own task (tokio + axum), so one client never stalls the others.
//! Example: `frugal web --port 8080`, then open http://127.0.0.1:8080/.

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use serde_json::{json, Value};

const PAGE: &str = include_str!("cmd_web/page.html");

/// Largest request body accepted (a config.json is a few KB).
pub const MAX_BODY: usize = 1 << 20;

const LONG_ABOUT: &str = "\
Serve the planner as a web page and a JSON API on this machine.

The page: pick a preset or paste a config.json, training or inference, turn the usual memory
remedies on and off (micro-batch + accumulation, recompute, ZeRO stage, offload, flash attention,
LoRA/QLoRA, TP/PP, weight and KV formats); it shows memory by category against the GPU, the
timeline over the step, what fits fastest first, and the `frugal plan` command to copy. It
updates as the knobs change.

The API answers the CLI's JSON (same fields, same numbers, same error text):
  GET  /api/plan?model=llama3-8b&train=true&zero=3&gpus=8&batch=4&seq=2048
  GET  /api/fit?model=llama3-8b&gpus=8&device-memory=80GiB&batch=32
  POST /api/plan?infer=true&weights=int4   (body: a config.json)
  GET  /api/models

Examples:
  frugal web
  frugal web --port 8080 --host 0.0.0.0";

/// Serve the planner as a web page and a JSON API.
#[derive(clap::Args)]
#[command(after_help = LONG_ABOUT)]
pub struct Args {
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
}

/// A response: status, content type, body.
struct Reply {
    status: u16,
    kind: &'static str,
    body: String,
}

impl Reply {
    fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            kind: "application/json",
            body: serde_json::to_string_pretty(v).unwrap_or_else(|_| "{}".into()),
        }
    }

    fn error(status: u16, message: String) -> Reply {
        Reply::json(status, &json!({ "error": message }))
    }
}

/// Decodes `%XX` and `+` of a query-string component.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=1&b=two` as (key, value) pairs, decoded.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), "true".into()),
        })
        .collect()
}

/// The CLI's argv for `command` from query pairs: `k=v` → `--k v` (underscores read as
/// hyphens), `k=true` → `--k` for a switch, `k=false` and empty values → nothing.
pub fn to_argv(command: &str, pairs: &[(String, String)]) -> Vec<String> {
    const SWITCHES: [&str; 8] = [
        "train",
        "infer",
        "sp",
        "double-quant",
        "tf32",
        "allow-lora",
        "keep-precision",
        "json",
    ];
    let mut argv = vec!["frugal".to_string(), command.to_string()];
    for (k, v) in pairs {
        let flag = k.replace('_', "-");
        if flag == "json" || v.is_empty() || v == "false" {
            continue;
        }
        if SWITCHES.contains(&flag.as_str()) {
            argv.push(format!("--{flag}"));
        } else {
            argv.push(format!("--{flag}"));
            argv.push(v.clone());
        }
    }
    argv
}

/// A clap parse of `argv` into `command`'s `Args`, errors as the CLI's text.
fn parse_args<T: clap::Args>(argv: &[String]) -> anyhow::Result<T> {
    #[derive(Parser)]
    struct One<U: clap::Args> {
        #[command(flatten)]
        inner: U,
    }
    let argv: Vec<&String> = argv.iter().skip(1).collect();
    One::<T>::try_parse_from(argv)
        .map(|o| o.inner)
        .map_err(|e| {
            let text = e.render().to_string();
            anyhow!("{}", text.trim_end().trim_start_matches("error: "))
        })
}

/// The presets and GPUs the page offers.
fn models() -> Value {
    let models: Vec<Value> = plan::presets::NAMES
        .iter()
        .filter_map(|name| plan::presets::by_name(name).ok().map(|m| (name, m)))
        .map(|(name, m)| {
            json!({
                "name": name,
                "family": m.family,
                "param_count": m.param_count(),
                "n_layers": m.n_layers,
                "d_model": m.d_model,
                "max_positions": m.max_positions,
                "sliding_window": m.sliding_window.map(|w| w.window),
            })
        })
        .collect();
    let gpus: Vec<Value> = fit::GPUS
        .iter()
        .map(|g| json!({ "name": g.name, "memory_bytes": g.memory_bytes }))
        .collect();
    json!({ "models": models, "gpus": gpus })
}

/// The pasted configs a body carries: a config.json (`paste` absent or `config`), a
/// ds_config.json (`paste=deepspeed`), or both as `{"config": ..., "deepspeed": ...}`
/// (`paste=both`).
fn pasted(
    pairs: &mut Vec<(String, String)>,
    body: Option<&str>,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let at = pairs.iter().position(|(k, _)| k == "paste");
    let kind = at.map(|i| pairs.remove(i).1);
    Ok(match (kind.as_deref(), body) {
        (_, None) => (None, None),
        (None | Some("config"), Some(b)) => (Some(b.to_string()), None),
        (Some("deepspeed"), Some(b)) => (None, Some(b.to_string())),
        (Some("both"), Some(b)) => {
            let v: Value = serde_json::from_str(b).map_err(|e| {
                anyhow!("paste=both: the body is a JSON object {{\"config\": ..., \"deepspeed\": ...}}: {e}")
            })?;
            let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            (text("config"), text("deepspeed"))
        }
        (Some(other), _) => bail!("paste={other}: use config, deepspeed or both"),
    })
}

/// Answers one API request: `path` without the query, `pairs` from it, `body` a config.json
/// (or what `paste` says it is).
pub fn answer(path: &str, pairs: &[(String, String)], body: Option<&str>) -> anyhow::Result<Value> {
    let mut pairs = pairs.to_vec();
    let (config, deepspeed) = pasted(&mut pairs, body)?;
    let body = config.as_deref();
    if deepspeed.is_some() && path == "/api/plan" {
        pairs.push(("deepspeed".into(), "ds_config.json".into()));
    }
    let with_model = |mut pairs: Vec<(String, String)>| {
        if body.is_some() && !pairs.iter().any(|(k, _)| k == "model") {
            pairs.push(("model".into(), "config.json".into()));
        }
        pairs
    };
    match path {
        "/api/models" => Ok(models()),
        "/api/plan" => {
            let argv = to_argv("plan", &with_model(pairs.to_vec()));
            let mut args: crate::cmd_plan::Args = parse_args(&argv)?;
            args.config_text = body.map(str::to_string);
            args.deepspeed_text = deepspeed.clone();
            let report = crate::cmd_plan::build_report(&args)?;
            let mut v = serde_json::to_value(&report)?;
            v["command"] = json!(argv[..].join(" "));
            Ok(v)
        }
        "/api/fit" => {
            let argv = to_argv("fit", &with_model(pairs.to_vec()));
            let mut args: crate::cmd_fit::Args = parse_args(&argv)?;
            args.config_text = body.map(str::to_string);
            crate::cmd_fit::json(&args)
        }
        other => Err(anyhow!(
            "no such endpoint {other}: use /api/plan, /api/fit or /api/models"
        )),
    }
}

/// Routes one request; never panics (a panic inside becomes a 500, an overflow a 400).
fn route(method: &str, url: &str, body: Option<&str>) -> Reply {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    if method == "GET" && (path == "/" || path == "/index.html") {
        return Reply {
            status: 200,
            kind: "text/html; charset=utf-8",
            body: PAGE.to_string(),
        };
    }
    if !path.starts_with("/api/") {
        return Reply::error(404, format!("no page at {path}: open / or use /api/..."));
    }
    if method != "GET" && method != "POST" {
        return Reply::error(405, format!("{method} is not served: use GET or POST"));
    }
    let pairs = parse_query(query);
    let result = std::panic::catch_unwind(|| answer(path, &pairs, body));
    match result {
        Ok(Ok(v)) => Reply::json(200, &v),
        Ok(Err(e)) => Reply::error(400, format!("{e:#}")),
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            if text.contains("with overflow") {
                Reply::error(
                    400,
                    "the sizes asked for overflow 64-bit byte counts: use a smaller batch, \
                     sequence or model"
                        .into(),
                )
            } else {
                Reply::error(500, format!("internal error: {text}"))
            }
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let addr = format!("{}:{}", args.host, args.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the server")?;
    runtime.block_on(serve(addr))
}

/// How long a client may take to send its body once its headers are in.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn serve(addr: String) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| anyhow!("invalid --port/--host: cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().context("the server's address")?;
    println!("frugal web: listening on http://{bound}/ (Ctrl-C to stop)");
    use std::io::Write;
    std::io::stdout().flush().ok();
    let app = axum::Router::new().fallback(handle);
    axum::serve(listener, app).await.context("serving")?;
    Ok(())
}

/// One request: its body bounded before it is read (a declared length over [`MAX_BODY`] is
/// refused unread), then answered by [`route`] on a blocking thread, so a slow or hostile client
/// holds only its own connection.
async fn handle(request: axum::extract::Request) -> axum::response::Response {
    use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
    use axum::response::IntoResponse;
    let method = request.method().as_str().to_string();
    let url = request.uri().to_string();
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_big = || {
        let limit = MAX_BODY >> 10;
        Reply::error(
            413,
            format!("the body is over {limit} KiB: send a config.json"),
        )
    };
    let reply = if declared.is_some_and(|n| n > MAX_BODY as u64) {
        too_big()
    } else {
        let body = axum::body::to_bytes(request.into_body(), MAX_BODY);
        match tokio::time::timeout(BODY_TIMEOUT, body).await {
            Err(_) => Reply::error(408, "the body did not arrive within 10 s".into()),
            Ok(Err(_)) => too_big(),
            Ok(Ok(bytes)) => match String::from_utf8(bytes.to_vec()) {
                Err(e) => Reply::error(400, format!("the body is not UTF-8 text: {e}")),
                Ok(body) => tokio::task::spawn_blocking(move || {
                    route(&method, &url, (!body.is_empty()).then_some(body.as_str()))
                })
                .await
                .unwrap_or_else(|e| Reply::error(500, format!("internal error: {e}"))),
            },
        }
    };
    let status = axum::http::StatusCode::from_u16(reply.status)
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(CONTENT_TYPE, reply.kind)], reply.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_become_the_clis_flags() {
        let pairs =
            parse_query("model=llama3-8b&train=true&zero=3&grad_accum=2&sp=false&x=a%2Bb+c");
        assert_eq!(
            to_argv("plan", &pairs),
            [
                "frugal",
                "plan",
                "--model",
                "llama3-8b",
                "--train",
                "--zero",
                "3",
                "--grad-accum",
                "2",
                "--x",
                "a+b c"
            ]
        );
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    /// Fuzzing the API: 3,000 seeded mutations of plan and fit queries and of a pasted
    /// config.json and ds_config.json each answer 200 or 400 (an arithmetic overflow is a 400,
    /// as the CLI makes it an error), never a 500.
    #[test]
    fn mutated_queries_and_bodies_answer_or_fail_clearly() {
        let queries = [
            "model=llama3-8b&train=true&zero=3&gpus=8&batch=4&seq=2048&device-memory=80GiB",
            "model=llama2-7b&infer=true&weights=int4&kv-dtype=fp8&batch=8&seq=4096",
        ];
        let config = r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
            "vocab_size": 32000, "max_position_embeddings": 2048}"#;
        let ds = include_str!("../../configs/tests/data/configs/hf_zero2_offload.json");
        let mut m = rng::mutate::Mutator::new(0x7765_6221);
        // Overflow panics are caught and answered 400; keep their messages off the test output.
        crate::silence_overflow_panics();
        let mut statuses = std::collections::BTreeMap::new();
        for i in 0..3000 {
            let q = String::from_utf8_lossy(&m.mutate(queries[i % 2].as_bytes())).into_owned();
            let body = String::from_utf8_lossy(&m.mutate(config.as_bytes())).into_owned();
            let pasted = String::from_utf8_lossy(&m.mutate(ds.as_bytes())).into_owned();
            let mut replies = vec![
                route("GET", &format!("/api/plan?{q}"), None),
                route("POST", "/api/plan?train=true&batch=2", Some(&body)),
                route(
                    "POST",
                    "/api/plan?model=gpt2-124m&gpus=8&paste=deepspeed",
                    Some(&pasted),
                ),
            ];
            if i % 30 == 0 {
                replies.push(route("GET", &format!("/api/fit?{q}"), None));
            }
            for r in replies {
                *statuses.entry(r.status).or_insert(0) += 1;
                assert_ne!(r.status, 500, "{}", r.body);
            }
        }
        assert!(statuses.get(&200).is_some_and(|n| *n > 100), "{statuses:?}");
    }
}
