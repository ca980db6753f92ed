//! The request queue the engines share (`--decode-ranks D`): the server's bounded channel, the
//! jobs an engine took but could not admit (parked for any engine with room, oldest first), and
//! a count of idle engines. An idle engine takes the next job, a parked one first; a busy engine
//! takes a parked job only if its KV pool can hold it, and a new one only while no engine is
//! idle and nothing is parked, so a job never waits on a full engine while another has room.
//!
//! Example: `let q = Queue::new(rx);` then each engine's `run(worker, tok, q.clone(), ...)`.

use super::engine::Job;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long an idle engine waits on the channel before it looks at the parked jobs again.
const RECHECK: Duration = Duration::from_millis(5);

#[derive(Clone)]
pub struct Queue(Arc<Shared>);

struct Shared {
    jobs: Mutex<mpsc::Receiver<Job>>,
    parked: Mutex<VecDeque<Job>>,
    idle: AtomicUsize,
}

impl Queue {
    pub fn new(jobs: mpsc::Receiver<Job>) -> Queue {
        Queue(Arc::new(Shared {
            jobs: Mutex::new(jobs),
            parked: Mutex::new(VecDeque::new()),
            idle: AtomicUsize::new(0),
        }))
    }

    fn pop_parked(&self) -> Option<Job> {
        self.0.parked.lock().ok()?.pop_front()
    }

    /// An idle engine's next job (a parked one first), waiting for it; `None` once the channel
    /// has closed and nothing is parked.
    pub(crate) fn wait(&self) -> Option<Job> {
        self.0.idle.fetch_add(1, Ordering::SeqCst);
        let job = loop {
            if let Some(job) = self.pop_parked() {
                break Some(job);
            }
            let Ok(jobs) = self.0.jobs.lock() else {
                break None;
            };
            match jobs.recv_timeout(RECHECK) {
                Ok(job) => break Some(job),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    drop(jobs);
                    break self.pop_parked();
                }
            }
        };
        self.0.idle.fetch_sub(1, Ordering::SeqCst);
        job
    }

    /// A busy engine's next job: the oldest parked one if `fits` it (`Empty` while it does not:
    /// it waits for an engine with room) or if its client has gone (the engine drops it, so it
    /// holds up no one), else a new one unless an engine is idle (`Empty`); `Disconnected` once
    /// the channel has closed.
    pub(crate) fn poll(&self, fits: impl Fn(&Job) -> bool) -> Result<Job, TryRecvError> {
        if let Ok(mut parked) = self.0.parked.lock() {
            if let Some(oldest) = parked.front() {
                return match fits(oldest) || oldest.events.is_closed() {
                    true => parked.pop_front().ok_or(TryRecvError::Empty),
                    false => Err(TryRecvError::Empty),
                };
            }
        }
        if self.0.idle.load(Ordering::SeqCst) > 0 {
            return Err(TryRecvError::Empty);
        }
        match self.0.jobs.try_lock() {
            Ok(jobs) => jobs.try_recv(),
            Err(_) => Err(TryRecvError::Empty),
        }
    }

    /// A job this engine took but cannot admit yet, for whichever engine first has room.
    pub(crate) fn park(&self, job: Job) {
        if let Ok(mut parked) = self.0.parked.lock() {
            parked.push_back(job);
        }
    }

    /// Blocks until `engines` engines wait for work, or `gave_up()` says one never will (its
    /// thread ended). A server listens only then: requests that came sooner would all go to the
    /// engines already up, as a busy engine takes new work while no other is idle.
    pub fn until_idle(&self, engines: usize, gave_up: impl Fn() -> bool) {
        while self.0.idle.load(Ordering::SeqCst) < engines && !gave_up() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub(crate) fn nothing_parked(&self) -> bool {
        self.0.parked.lock().map_or(true, |p| p.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Event;
    use std::time::Instant;

    /// A job of `len` prompt tokens whose client waits for it (its receiver is kept alive).
    fn job(len: usize) -> Job {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        std::mem::forget(rx);
        abandoned_job(len, events)
    }

    /// A job of `len` prompt tokens sending to `events`.
    fn abandoned_job(len: usize, events: tokio::sync::mpsc::UnboundedSender<Event>) -> Job {
        Job {
            prompt: vec![1; len],
            max_tokens: 1,
            sampling: infer::sample::Sampling::greedy(),
            seed: 0,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            events,
            queued_at: Instant::now(),
        }
    }

    #[test]
    fn a_parked_job_goes_to_the_first_engine_with_room_before_any_new_one() {
        let (tx, rx) = mpsc::sync_channel(4);
        let q = Queue::new(rx);
        tx.send(job(1)).unwrap();
        // A busy engine takes the new job, cannot hold it, parks it.
        let first = q.poll(|_| true).unwrap();
        q.park(first);
        tx.send(job(2)).unwrap();
        // An engine without room for it gets nothing, not the newer job behind it.
        assert!(matches!(q.poll(|_| false), Err(TryRecvError::Empty)));
        // An engine with room takes the parked one first, then the new one.
        assert_eq!(q.poll(|_| true).unwrap().prompt.len(), 1);
        assert_eq!(q.poll(|_| true).unwrap().prompt.len(), 2);
        // An idle engine takes a parked job too.
        q.park(job(3));
        assert_eq!(q.wait().unwrap().prompt.len(), 3);
        // Closed: what is parked still comes out, then nothing.
        q.park(job(4));
        drop(tx);
        assert_eq!(q.wait().unwrap().prompt.len(), 4);
        assert!(q.wait().is_none());
        assert!(matches!(q.poll(|_| true), Err(TryRecvError::Disconnected)));
    }

    #[test]
    fn a_busy_engine_takes_no_new_job_while_another_is_idle() {
        let (tx, rx) = mpsc::sync_channel(4);
        let q = Queue::new(rx);
        tx.send(job(5)).unwrap();
        // An engine counted idle (as `wait` counts itself): the busy one leaves the job to it.
        q.0.idle.fetch_add(1, Ordering::SeqCst);
        assert!(matches!(q.poll(|_| true), Err(TryRecvError::Empty)));
        q.0.idle.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(q.poll(|_| true).unwrap().prompt.len(), 5);
    }

    #[test]
    fn a_parked_job_whose_client_left_goes_to_any_engine_to_be_dropped() {
        let (tx, rx) = mpsc::sync_channel(4);
        let q = Queue::new(rx);
        let (events, client) = tokio::sync::mpsc::unbounded_channel();
        q.park(abandoned_job(6, events));
        tx.send(job(7)).unwrap();
        // While its client waits, an engine without room gets nothing.
        assert!(matches!(q.poll(|_| false), Err(TryRecvError::Empty)));
        drop(client);
        // Gone: even an engine without room takes it (to drop it), then the job behind it.
        assert_eq!(q.poll(|_| false).unwrap().prompt.len(), 6);
        assert_eq!(q.poll(|_| true).unwrap().prompt.len(), 7);
    }
}
