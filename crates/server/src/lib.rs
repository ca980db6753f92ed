//! A model behind the OpenAI API, as `vllm serve` and `llama-server` offer it (`frugal serve`).
//! `POST /v1/completions`, `POST /v1/chat/completions` (the model's chat template), `GET
//! /v1/models`, `GET /health`; `stream: true` answers with server-sent events (and a usage chunk
//! with `stream_options.include_usage`); `max_tokens`, `temperature`, `top_k`, `top_p`, `seed`,
//! `stop` and `logprobs` are honoured and `usage` counts the tokens.
//!
//! HTTP is tokio + axum ([`openai::router`]: bodies bounded before they are read, one task per
//! connection); the model runs on engine threads of their own ([`engine::run`], one per decode
//! worker), fed through a bounded queue ([`queue`]): a full queue answers 429 with `Retry-After`, a
//! prompt that does not fit the context 400. Requests share an engine's continuous batch over its paged
//! KV pool; a client that disconnects has its generation stopped and its KV blocks freed at the next
//! token. `GET /metrics` is Prometheus text ([`metrics`]). Prompts may be prefilled by workers of
//! their own that ship the KV to the decoding one ([`pd`]). This crate prints nothing: the binary
//! binds, reports and stops it.
//!
//! Example: `axum::serve(listener, server::openai::router(state))`, with `state` holding the
//! sending end of the queue that `server::engine::run` reads on its own thread
//! (`server::queue::Queue::new` over the receiving end).

pub mod engine;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod pd;
pub mod queue;
mod request;

use std::sync::Arc;

/// What every handler shares.
pub struct State {
    /// The model's name in `/v1/models` and in answers.
    pub name: String,
    pub tok: data::Tokenizer,
    /// The context in tokens: a prompt and its `max_tokens` must fit it.
    pub ctx: usize,
    /// The engine's queue: full, a request is answered 429.
    pub jobs: std::sync::mpsc::SyncSender<engine::Job>,
    pub metrics: Arc<metrics::Metrics>,
    /// Whether the engines see each token's logits (not when prefill workers sample the first).
    pub logprobs: bool,
}
