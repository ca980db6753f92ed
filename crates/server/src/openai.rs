//! The OpenAI API over the engine: request fields in, completions (whole, or streamed as
//! server-sent events ending in `data: [DONE]`) out, errors as `{"error": {"message", "type"}}`
//! with the status the API uses (400 bad request, 404, 413, 429 with `Retry-After`, 503).

use super::engine::{Event, Job};
use super::logprobs;
use super::request::{check_fields, params, parse};
use super::State;
use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
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

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    let kind = match status {
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request_error",
    };
    let body = json!({"error": {"message": message, "type": kind}});
    (status, axum::Json(body)).into_response()
}

pub(crate) fn bad(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, &message.into())
}

async fn models(Shared(state): Shared<Arc<State>>) -> Response {
    let model = json!({"id": state.name, "object": "model", "owned_by": "frugal"});
    axum::Json(json!({"object": "list", "data": [model]})).into_response()
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

/// Tokenizes, checks the context, queues the job and answers whole or streamed.
async fn submit(state: &State, v: &Value, text: &str, chat: bool, default_max: usize) -> Response {
    if let Some(refused) = check_fields(state, v, chat) {
        return refused;
    }
    let p = match params(v, &state.tok, chat) {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    if p.logprobs.is_some() && !state.logprobs {
        return bad(
            "logprobs: this server's prompts run on prefill workers, which do not return their \
             first token's logits; serve without --prefill-ranks to have them",
        );
    }
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
        logprobs: p.logprobs,
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
        tok: p.logprobs.map(|_| state.tok.clone()),
    };
    if p.stream {
        // Each chunk carries the log-probabilities of the tokens since the last one.
        let start = Stream {
            usage: p.include_usage.then_some(prompt_tokens),
            ..Stream::default()
        };
        let start = (rx, shape, start);
        let stream = futures_util::stream::unfold(start, |(mut rx, shape, mut s)| async move {
            if s.done {
                return None;
            }
            let (data, last) = loop {
                match rx.recv().await {
                    Some(Event::Token(lp)) => s.tokens.push(lp),
                    Some(Event::Text(t)) => break (shape.chunk(Some(&t), None, &mut s), false),
                    Some(Event::Done {
                        finish_reason,
                        completion_tokens,
                    }) => {
                        let chunk = shape.chunk(None, Some(finish_reason), &mut s);
                        s.ending = s
                            .usage
                            .map(|prompt| shape.usage_chunk(prompt, completion_tokens));
                        break (chunk, false);
                    }
                    Some(Event::Failed(e)) => {
                        break (
                            json!({"error": {"message": e, "type": "server_error"}}),
                            true,
                        )
                    }
                    // With stream_options.include_usage: the usage chunk, then [DONE].
                    None if s.ending.is_some() => {
                        let usage = s.ending.take().unwrap_or_default().to_string();
                        return Some((Ok(Sse::default().data(usage)), (rx, shape, s)));
                    }
                    None => {
                        s.done = true;
                        let done = Sse::default().data("[DONE]");
                        return Some((Ok::<_, std::convert::Infallible>(done), (rx, shape, s)));
                    }
                }
            };
            s.done = last;
            Some((Ok(Sse::default().data(data.to_string())), (rx, shape, s)))
        });
        return SseBody::new(stream).into_response();
    }
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token(lp) => tokens.push(lp),
            Event::Text(t) => text.push_str(&t),
            Event::Failed(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e),
            Event::Done {
                finish_reason,
                completion_tokens,
            } => {
                let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens});
                let lps = p.logprobs.map(|_| shape.logprobs(&state.tok, &tokens));
                let answer = shape.whole(&text, finish_reason, usage, lps);
                return axum::Json(answer).into_response();
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
    /// The tokenizer, for the log-probabilities' token texts (when asked).
    tok: Option<data::Tokenizer>,
}

/// A stream's state between chunks: tokens whose log-probabilities await the next chunk, the
/// prompt's tokens when the usage is asked for (`stream_options.include_usage`), the usage chunk
/// once the answer is done, and whether the stream has ended.
#[derive(Default)]
struct Stream {
    tokens: Vec<logprobs::TokenLogprob>,
    usage: Option<usize>,
    ending: Option<Value>,
    done: bool,
}

impl Shape {
    /// The choice's `logprobs` in this endpoint's layout.
    fn logprobs(&self, tok: &data::Tokenizer, tokens: &[logprobs::TokenLogprob]) -> Value {
        match self.chat {
            true => logprobs::chat(tok, tokens),
            false => logprobs::completion(tok, tokens),
        }
    }

    fn whole(&self, text: &str, finish: &str, usage: Value, lps: Option<Value>) -> Value {
        let lps = lps.unwrap_or(Value::Null);
        let choice = match self.chat {
            true => json!({"index": 0, "message": {"role": "assistant", "content": text},
                           "logprobs": lps, "finish_reason": finish}),
            false => json!({"index": 0, "text": text, "logprobs": lps, "finish_reason": finish}),
        };
        let object = if self.chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": [choice], "usage": usage})
    }

    /// The last chunk of a stream that asked for its usage: no choices, the counts.
    fn usage_chunk(&self, prompt: usize, completion: usize) -> Value {
        let object = match self.chat {
            true => "chat.completion.chunk",
            false => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion}})
    }

    fn chunk(&self, text: Option<&str>, finish: Option<&str>, s: &mut Stream) -> Value {
        let lps = match &self.tok {
            Some(tok) => self.logprobs(tok, &std::mem::take(&mut s.tokens)),
            None => Value::Null,
        };
        let choice = match self.chat {
            true => json!({"index": 0, "delta": text.map_or(json!({}), |t| json!({"content": t})),
                           "logprobs": lps, "finish_reason": finish}),
            false => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": lps,
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
