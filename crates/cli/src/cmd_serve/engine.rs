//! The engine thread of `frugal serve`: one worker (weights, paged KV cache, prefill and decode
//! steps) owned by a thread of its own, fed jobs through a bounded queue, answering each with a
//! stream of events. Jobs run one after another; a job whose client has gone is dropped at its
//! next token and its KV blocks freed.

use infer::sample::Sampling;
use infer::Worker;
use std::sync::mpsc;

/// What a request asks for, tokenized.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Text that ends the answer where it first appears (not included).
    pub stop: Vec<String>,
    pub events: tokio::sync::mpsc::UnboundedSender<Event>,
}

/// What the engine sends back for a job.
#[derive(Debug)]
pub enum Event {
    /// New text (may be empty while a multi-byte character is incomplete).
    Text(String),
    Done {
        finish_reason: &'static str,
        completion_tokens: usize,
    },
    Failed(String),
}

/// Runs jobs from `jobs` on `worker` until the queue closes.
pub fn run(mut worker: Worker, tok: data::Tokenizer, jobs: mpsc::Receiver<Job>) {
    for job in jobs {
        let result = serve_one(&mut worker, &tok, &job);
        if let Err(e) = result {
            let _ = job.events.send(Event::Failed(format!("{e:#}")));
        }
    }
}

fn serve_one(worker: &mut Worker, tok: &data::Tokenizer, job: &Job) -> anyhow::Result<()> {
    let mut rng = data::SplitMix64::new(job.seed);
    let seq = worker.new_sequence();
    let result = (|| {
        let mut logits = Vec::new();
        worker.prefill(seq, &job.prompt, &mut logits)?;
        let (mut ids, mut sent) = (Vec::new(), String::new());
        let (mut finish, mut stopped_at_text) = ("length", false);
        for i in 0..job.max_tokens {
            let t = infer::sample::pick(&logits, &job.sampling, &mut rng);
            if Some(t) == tok.eos() {
                finish = "stop";
                break;
            }
            ids.push(t);
            let text = tok.decode(&ids)?;
            // Hold back an incomplete character (U+FFFD at the end) until it completes.
            let settled = text.trim_end_matches('\u{FFFD}');
            let (piece, stopped) = match job.stop.iter().filter_map(|s| text.find(s.as_str())).min()
            {
                Some(at) => (text[..at].get(sent.len()..).unwrap_or("").to_string(), true),
                None => (settled.get(sent.len()..).unwrap_or("").to_string(), false),
            };
            if !piece.is_empty() {
                sent.push_str(&piece);
                if job.events.send(Event::Text(piece)).is_err() {
                    return Ok(()); // the client has gone: free its blocks now
                }
            }
            if stopped {
                (finish, stopped_at_text) = ("stop", true);
                break;
            }
            if i + 1 < job.max_tokens {
                worker.decode(&[seq], &[t], &mut logits)?;
            }
        }
        // What was held back (an incomplete character at the very end) goes out as it is.
        if !stopped_at_text {
            let text = tok.decode(&ids)?;
            if let Some(rest) = text.get(sent.len()..).filter(|r| !r.is_empty()) {
                let _ = job.events.send(Event::Text(rest.to_string()));
            }
        }
        let _ = job.events.send(Event::Done {
            finish_reason: finish,
            completion_tokens: ids.len(),
        });
        Ok(())
    })();
    worker.free(seq);
    result
}
