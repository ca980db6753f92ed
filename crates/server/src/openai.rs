//! The OpenAI API over the engine: request fields in, completions (whole, or streamed as
//! server-sent events ending in `data: [DONE]`) out, errors as `{"error": {"message", "type"}}`
//! with the status the API uses (400 bad request, 404, 413, 429 with `Retry-After`, 503).

use super::engine::{Event, Job};
use super::State;
use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use infer::sample::Sampling;
use serde_json::{json, Value};
use std::sync::Arc;

pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|Shared(state): Shared<Arc<State>>| async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    state.metrics.render(),
                )
            }),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint: use /v1/completions, /v1/chat/completions, /v1/models, /health or /metrics",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY as usize))
        .layer(axum::middleware::from_fn(declared_size))
        .with_state(state)
}

/// The largest request body read.
const MAX_BODY: u64 = 1 << 20;

/// A body declared larger than [`MAX_BODY`] is refused before any of it is read (the limit
/// above stops a body that grows past it while being read).
async fn declared_size(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let declared = (req.headers().get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > MAX_BODY => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body declares {n} bytes; requests are limited to {MAX_BODY} bytes"),
        ),
        _ => next.run(req).await,
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let kind = match status {
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request_error",
    };
    let body = json!({"error": {"message": message, "type": kind}});
    (status, axum::Json(body)).into_response()
}

fn bad(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, &message.into())
}

async fn models(Shared(state): Shared<Arc<State>>) -> Response {
    let model = json!({"id": state.name, "object": "model", "owned_by": "frugal"});
    axum::Json(json!({"object": "list", "data": [model]})).into_response()
}

/// The request's sampling fields; an unsupported one is refused by name, never ignored.
struct Params {
    max_tokens: Option<usize>,
    sampling: Sampling,
    seed: u64,
    stop: Vec<String>,
    stream: bool,
    ignore_eos: bool,
}

fn params(v: &Value, tok: &data::Tokenizer) -> Result<Params, String> {
    let vocab = tok.vocab_size() as usize;
    for (key, neutral) in [("n", json!(1)), ("best_of", json!(1))] {
        if v.get(key)
            .is_some_and(|x| !x.is_null() && x.as_f64() != neutral.as_f64())
        {
            return Err(format!("{key} other than {neutral} is not supported"));
        }
    }
    if v.get("logprobs")
        .is_some_and(|x| !x.is_null() && x != &json!(false))
    {
        return Err("logprobs is not supported".into());
    }
    let uint = |key: &str| -> Result<Option<u64>, String> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{key} must be a non-negative integer, not {x}")),
        }
    };
    let temperature = match v.get("temperature") {
        None | Some(Value::Null) => 1.0,
        Some(x) => match x.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => t as f32,
            _ => return Err(format!("temperature must be between 0 and 2, not {x}")),
        },
    };
    let top_k = match v.get("top_k") {
        None | Some(Value::Null) => vocab,
        Some(x) => match x.as_i64() {
            Some(-1) | Some(0) => vocab,
            Some(k) if k > 0 => (k as usize).min(vocab),
            _ => {
                return Err(format!(
                    "top_k must be a positive integer (or -1 for all), not {x}"
                ))
            }
        },
    };
    let top_p = match v.get("top_p") {
        None | Some(Value::Null) => 1.0,
        Some(x) => match x.as_f64() {
            Some(p) if p > 0.0 && p <= 1.0 => p as f32,
            _ => return Err(format!("top_p must be above 0 and at most 1, not {x}")),
        },
    };
    // Temperature 0 is greedy, as the API defines it.
    let sampling = match temperature == 0.0 || top_k == 1 {
        true => Sampling {
            vocab_limit: Some(vocab),
            ..Sampling::greedy()
        },
        false => Sampling {
            top_k: Some(top_k),
            temperature,
            top_p,
            vocab_limit: Some(vocab),
        },
    };
    let stop = match v.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(|s| s.as_str().map(String::from))
            .collect(),
        Some(x) => return Err(format!("stop must be a string or up to 4 strings, not {x}")),
    };
    let seed = uint("seed")?.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    Ok(Params {
        max_tokens: uint("max_tokens")?
            .or(uint("max_completion_tokens")?)
            .map(|m| m as usize),
        sampling,
        seed,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        ignore_eos: v
            .get("ignore_eos")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// The body as a JSON object, or what is wrong with it.
fn parse(body: &Bytes) -> Result<Value, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    match v.is_object() {
        true => Ok(v),
        false => Err("the body must be a JSON object".into()),
    }
}

async fn completions(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    let prompt = match v.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or("").into()
        }
        _ => return bad("prompt must be a string"),
    };
    submit(&state, &v, &prompt, false, 16).await
}

async fn chat(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    let Some(messages) = v.get("messages").and_then(Value::as_array) else {
        return bad("messages must be an array of {role, content}");
    };
    let mut turns = Vec::new();
    for m in messages {
        match (
            m.get("role").and_then(Value::as_str),
            m.get("content").and_then(Value::as_str),
        ) {
            (Some(role), Some(content)) => turns.push((role.to_string(), content.to_string())),
            _ => {
                return bad(format!(
                    "each message needs a string role and content, not {m}"
                ))
            }
        }
    }
    if turns.is_empty() {
        return bad("messages is empty");
    }
    let prompt = match models::chat::render_messages(&state.tok, &turns) {
        Ok(p) => p,
        Err(e) => return bad(format!("{e:#}")),
    };
    submit(&state, &v, &prompt, true, usize::MAX).await
}

/// The request fields each endpoint reads or refuses by name when not neutral; any other field
/// is an error, not silently ignored.
/// `ignore_eos` is vLLM's and llama-server's extension (benchmarks use it for exact lengths).
const COMPLETION_FIELDS: &str = "model prompt max_tokens max_completion_tokens temperature top_p \
     top_k n best_of stream stream_options stop seed logprobs user frequency_penalty \
     presence_penalty ignore_eos";
const CHAT_FIELDS: &str = "model messages max_tokens max_completion_tokens temperature top_p \
     top_k n stream stream_options stop seed logprobs top_logprobs user frequency_penalty \
     presence_penalty ignore_eos";

/// Refuses fields the endpoint does not know, penalties it does not apply, and a model other
/// than the one served (404, as OpenAI answers an unknown model): the answer, if refused.
fn check_fields(state: &State, v: &Value, chat: bool) -> Option<Response> {
    let known = if chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    let known: Vec<&str> = known.split_whitespace().collect();
    if let Some(map) = v.as_object() {
        let unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|k| !known.contains(k))
            .collect();
        if !unknown.is_empty() {
            return Some(bad(format!(
                "unknown field{} {}: this endpoint takes {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                known.join(", ")
            )));
        }
    }
    for key in ["frequency_penalty", "presence_penalty"] {
        if v.get(key)
            .is_some_and(|x| !x.is_null() && x.as_f64() != Some(0.0))
        {
            return Some(bad(format!("{key} other than 0 is not supported")));
        }
    }
    match v.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) if served_as(state, m) => None,
        Some(m) => Some(error(
            StatusCode::NOT_FOUND,
            &format!(
                "model {m} is not served here: use \"{}\" (GET /v1/models)",
                state.name
            ),
        )),
    }
}

/// Whether `name` names the served model: its path as given, or the file or folder name with
/// or without its extension.
fn served_as(state: &State, name: &str) -> bool {
    let path = std::path::Path::new(&state.name);
    name == state.name
        || path.file_name().is_some_and(|f| f == name)
        || path.file_stem().is_some_and(|f| f == name)
}

/// Tokenizes, checks the context, queues the job and answers whole or streamed.
async fn submit(state: &State, v: &Value, text: &str, chat: bool, default_max: usize) -> Response {
    if let Some(refused) = check_fields(state, v, chat) {
        return refused;
    }
    let p = match params(v, &state.tok) {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    let mut prompt: Vec<u32> = state.tok.bos().into_iter().collect();
    prompt.extend(state.tok.encode(text));
    let room = state.ctx.saturating_sub(prompt.len());
    let max_tokens = p.max_tokens.unwrap_or(default_max.min(room));
    if prompt.is_empty() || prompt.len().saturating_add(max_tokens) > state.ctx || max_tokens == 0 {
        return bad(format!(
            "the prompt is {} tokens and max_tokens {max_tokens}; this server's context is {} \
             tokens (prompt and answer together, at least one new token)",
            prompt.len(),
            state.ctx
        ));
    }
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    let job = Job {
        prompt,
        max_tokens,
        sampling: p.sampling,
        seed: p.seed,
        stop: p.stop,
        ignore_eos: p.ignore_eos,
        events,
        queued_at: std::time::Instant::now(),
    };
    // Counted before the send: the engine may take the job before this line returns.
    state.metrics.queued();
    let sent = state.jobs.try_send(job);
    if sent.is_err() {
        state.metrics.dequeued();
    }
    match sent {
        Ok(()) => {}
        Err(std::sync::mpsc::TrySendError::Full(_)) => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "the queue is full: retry shortly",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return r;
        }
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped"),
    }
    let id = format!("cmpl-{:016x}", p.seed);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let shape = Shape {
        id,
        created,
        model: state.name.clone(),
        chat,
    };
    if p.stream {
        let stream =
            futures_util::stream::unfold((rx, shape, false), |(mut rx, shape, done)| async move {
                if done {
                    return None;
                }
                let (data, last) = match rx.recv().await {
                    Some(Event::Text(t)) => (shape.chunk(Some(&t), None), false),
                    Some(Event::Done { finish_reason, .. }) => {
                        (shape.chunk(None, Some(finish_reason)), false)
                    }
                    Some(Event::Failed(e)) => (
                        json!({"error": {"message": e, "type": "server_error"}}),
                        true,
                    ),
                    None => {
                        return Some((
                            Ok::<_, std::convert::Infallible>(Sse::default().data("[DONE]")),
                            (rx, shape, true),
                        ))
                    }
                };
                Some((Ok(Sse::default().data(data.to_string())), (rx, shape, last)))
            });
        return SseBody::new(stream).into_response();
    }
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Failed(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e),
            Event::Done {
                finish_reason,
                completion_tokens,
            } => {
                let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens});
                return axum::Json(shape.whole(&text, finish_reason, usage)).into_response();
            }
        }
    }
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine dropped the request",
    )
}

/// The fields every answer of one request repeats.
struct Shape {
    id: String,
    created: u64,
    model: String,
    chat: bool,
}

impl Shape {
    fn whole(&self, text: &str, finish: &str, usage: Value) -> Value {
        let choice = match self.chat {
            true => json!({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish}),
            false => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
        };
        let object = if self.chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": [choice], "usage": usage})
    }

    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> Value {
        let choice = match self.chat {
            true => json!({"index": 0, "delta": text.map_or(json!({}), |t| json!({"content": t})),
                           "finish_reason": finish}),
            false => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null,
                            "finish_reason": finish}),
        };
        let object = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": [choice]})
    }
}
