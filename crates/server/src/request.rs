//! An OpenAI request's fields: the sampling parameters (`temperature`, `top_k`, `top_p`, `seed`,
//! `stop`, `max_tokens`, `logprobs`), each refused by name when out of range or unsupported,
//! never ignored; and the fields each endpoint knows (any other is an error naming it).
//!
//! Example: `params(&json!({"prompt": "a", "top_p": 0.9}), &tok, false)?.sampling.top_p` is 0.9.

use super::logprobs;
use super::openai::{bad, error};
use super::State;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use infer::sample::Sampling;
use serde_json::{json, Value};

/// The request's sampling fields; an unsupported one is refused by name, never ignored.
pub(crate) struct Params {
    pub(crate) max_tokens: Option<usize>,
    pub(crate) sampling: Sampling,
    pub(crate) seed: u64,
    pub(crate) stop: Vec<String>,
    pub(crate) stream: bool,
    /// `stream_options.include_usage`: a last chunk with the counts.
    pub(crate) include_usage: bool,
    pub(crate) ignore_eos: bool,
    /// The alternatives each token's log-probability comes with (`None`: none asked).
    pub(crate) logprobs: Option<usize>,
}

pub(crate) fn params(v: &Value, tok: &data::Tokenizer, chat: bool) -> Result<Params, String> {
    let vocab = tok.vocab_size() as usize;
    for (key, neutral) in [("n", json!(1)), ("best_of", json!(1))] {
        if v.get(key)
            .is_some_and(|x| !x.is_null() && x.as_f64() != neutral.as_f64())
        {
            return Err(format!("{key} other than {neutral} is not supported"));
        }
    }
    let logprobs = logprobs_asked(v, chat)?;
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
    let (stream, include_usage) = (flag(v, "stream")?, stream_options(v)?);
    if !stream && v.get("stream_options").is_some_and(|o| !o.is_null()) {
        return Err("stream_options needs stream: true".into());
    }
    Ok(Params {
        max_tokens: uint("max_tokens")?
            .or(uint("max_completion_tokens")?)
            .map(|m| m as usize),
        sampling,
        seed,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        stream,
        include_usage,
        ignore_eos: flag(v, "ignore_eos")?,
        logprobs,
    })
}

/// `stream_options`: `include_usage` is read; any other option is refused by name.
fn stream_options(v: &Value) -> Result<bool, String> {
    match v.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(format!(
                    "stream_options.{k} is not supported (include_usage is)"
                ));
            }
            flag(&Value::Object(o.clone()), "include_usage")
                .map_err(|e| format!("stream_options.{e}"))
        }
        Some(x) => Err(format!("stream_options must be an object, not {x}")),
    }
}

/// A true/false field (absent or null: false); anything else is refused by name.
fn flag(v: &Value, key: &str) -> Result<bool, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(x) => Err(format!("{key} must be true or false, not {x}")),
    }
}

/// The alternatives a request's `logprobs` asks for: the completions API's `logprobs: N`, or the
/// chat API's `logprobs: true` with `top_logprobs: N` (0 without it).
fn logprobs_asked(v: &Value, chat: bool) -> Result<Option<usize>, String> {
    let count = |key: &str, x: &Value| match x.as_u64() {
        Some(n) if n as usize <= logprobs::MAX_TOP => Ok(n as usize),
        _ => Err(format!(
            "{key} must be an integer from 0 to {}, not {x}",
            logprobs::MAX_TOP
        )),
    };
    let top = match v.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(x) => Some(count("top_logprobs", x)?),
    };
    match (chat, v.get("logprobs")) {
        (true, None | Some(Value::Null) | Some(Value::Bool(false))) => match top {
            Some(_) => Err("top_logprobs needs logprobs: true".into()),
            None => Ok(None),
        },
        (true, Some(Value::Bool(true))) => Ok(Some(top.unwrap_or(0))),
        (true, Some(x)) => Err(format!("logprobs must be true or false, not {x}")),
        (false, None | Some(Value::Null) | Some(Value::Bool(false))) => Ok(None),
        (false, Some(x)) => Ok(Some(count("logprobs", x)?)),
    }
}

/// The body as a JSON object, or what is wrong with it.
pub(crate) fn parse(body: &Bytes) -> Result<Value, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    match v.is_object() {
        true => Ok(v),
        false => Err("the body must be a JSON object".into()),
    }
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
pub(crate) fn check_fields(state: &State, v: &Value, chat: bool) -> Option<Response> {
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
