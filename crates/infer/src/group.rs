//! A tensor-parallel group driven from one thread, as a server's engine loop drives one worker:
//! rank 0's worker lives with the caller, and every other rank's on a thread of its own that
//! repeats each call the caller makes (new sequences, prefills, decode steps, forks, frees), in
//! the same order, so the ranks meet at the same collectives inside each step. Every rank's
//! block manager sees the same calls and hands out the same sequence ids and blocks, so a
//! refusal (a full pool, a context overrun) happens on every rank before any collective.
//!
//! A group of one is the worker alone (no threads).
//!
//! Example: `let mut g = Group::start(config, setup, 2, Arc::new(|w| w.load_whole_units(&units)))?;`
//! then `g.prefill(g.new_sequence(), &prompt, &mut logits)?` as on a [`Worker`].

use super::blocks::SeqId;
use super::Worker;
use engine::arena::Measured;
use engine::config::ModelConfig;
use engine::error::EngineError;
use plan_frugal::ServeSetup;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// How each rank fills its worker's weights (its share of the whole model's, usually
/// [`Worker::load_whole_units`]).
pub type Load = Arc<dyn Fn(&mut Worker) -> Result<(), EngineError> + Send + Sync>;

/// What the other ranks repeat.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    NewSequence,
    Prefill(SeqId, Vec<u32>),
    Decode(Vec<SeqId>, Vec<u32>),
    Fork(SeqId),
    Free(SeqId),
}

impl Call {
    /// The call as bytes (another process's copy): a kind, then little-endian words.
    pub fn to_bytes(&self) -> Vec<u8> {
        let words: Vec<u64> = match self {
            Call::NewSequence => vec![0],
            Call::Prefill(id, tokens) => [1, id.0 as u64]
                .into_iter()
                .chain(tokens.iter().map(|&t| u64::from(t)))
                .collect(),
            Call::Decode(ids, tokens) => [2, ids.len() as u64]
                .into_iter()
                .chain(ids.iter().map(|i| i.0 as u64))
                .chain(tokens.iter().map(|&t| u64::from(t)))
                .collect(),
            Call::Fork(id) => vec![3, id.0 as u64],
            Call::Free(id) => vec![4, id.0 as u64],
        };
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A call from [`Call::to_bytes`]; `None` for bytes that are not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Call> {
        if bytes.len() % 8 != 0 {
            return None;
        }
        let w: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let id = |i: usize| w.get(i).map(|&x| SeqId(x as usize));
        let tokens = |from: usize| w.get(from..).map(|t| t.iter().map(|&x| x as u32).collect());
        Some(match *w.first()? {
            0 => Call::NewSequence,
            1 => Call::Prefill(id(1)?, tokens(2)?),
            2 => {
                let end = usize::try_from(*w.get(1)?).ok()?.checked_add(2)?;
                let ids = w.get(2..end)?.iter().map(|&x| SeqId(x as usize)).collect();
                Call::Decode(ids, tokens(end)?)
            }
            3 => Call::Fork(id(1)?),
            4 => Call::Free(id(1)?),
            _ => return None,
        })
    }

    /// Makes this call on `worker`. Errors are the lead's to report: it makes the same call
    /// and sees the same refusal, or the failed collective.
    pub fn apply(&self, worker: &mut Worker, logits: &mut Vec<f32>) {
        let _ = match self {
            Call::NewSequence => {
                worker.new_sequence();
                Ok(())
            }
            Call::Prefill(id, tokens) => worker.prefill(*id, tokens, logits),
            Call::Decode(ids, tokens) => worker.decode(ids, tokens, logits),
            Call::Fork(id) => {
                worker.fork(*id);
                Ok(())
            }
            Call::Free(id) => {
                worker.free(*id);
                Ok(())
            }
        };
    }
}

/// Where the other ranks' copies of each call go: threads of this process ([`Group::start`]),
/// or other processes (a caller's relay over MPI).
pub trait Relay: Send {
    fn tell(&mut self, call: &Call);
    /// The other ranks, whose calls this relays.
    fn ranks(&self) -> usize;
    /// Ends the other ranks: their measured bytes in rank order, where known.
    fn end(self: Box<Self>) -> Vec<Measured>;
}

/// Rank 0's worker and where the other ranks' calls go.
pub struct Group {
    lead: Worker,
    relay: Option<Box<dyn Relay>>,
}

/// The other ranks as threads of this process.
struct Threads {
    calls: Vec<mpsc::Sender<Call>>,
    threads: Vec<JoinHandle<Measured>>,
}

impl Relay for Threads {
    fn tell(&mut self, call: &Call) {
        for c in &self.calls {
            // A rank that has stopped makes the next step's collectives fail on the lead.
            let _ = c.send(call.clone());
        }
    }

    fn ranks(&self) -> usize {
        self.calls.len()
    }

    fn end(self: Box<Self>) -> Vec<Measured> {
        let Threads { calls, threads } = *self;
        drop(calls);
        // A rank that panicked measured nothing: its plan's bytes were never all live.
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    }
}

impl Group {
    /// A group of one: `worker` alone.
    pub fn single(worker: Worker) -> Group {
        Group {
            lead: worker,
            relay: None,
        }
    }

    /// Rank 0's `worker` (a tensor-parallel rank), the others' calls sent through `relay`.
    pub fn with_relay(worker: Worker, relay: Box<dyn Relay>) -> Group {
        Group {
            lead: worker,
            relay: Some(relay),
        }
    }

    /// `tp` ranks serving `config` (threads of this process), each sized by `setup` and filled
    /// by `load`; the first rank's error if any fails to start.
    pub fn start(
        config: ModelConfig,
        setup: ServeSetup,
        tp: usize,
        load: Load,
    ) -> Result<Group, EngineError> {
        let timeout = engine::world::DEFAULT_TIMEOUT;
        let mut comms = engine::world::communicators(tp, timeout)?.into_iter();
        let lead_comm = comms.next().expect("a group has a rank 0");
        let (mut calls, mut threads, mut ready) = (Vec::new(), Vec::new(), Vec::new());
        for (i, comm) in comms.enumerate() {
            let (tx, rx) = mpsc::channel();
            let (ok_tx, ok_rx) = mpsc::channel();
            let (config, load) = (config.clone(), load.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tp rank {}", i + 1))
                .spawn(move || follow(config, setup, comm, load, ok_tx, rx))
                .map_err(|e| EngineError::Infer(format!("starting tensor-parallel rank: {e}")))?;
            calls.push(tx);
            threads.push(thread);
            ready.push(ok_rx);
        }
        let lead = Worker::tensor_parallel(cpu::Cpu::new(), config, setup, lead_comm, None)
            .and_then(|mut w| load(&mut w).map(|()| w));
        let mut group_err = None;
        for (r, ok) in ready.into_iter().enumerate() {
            let got = ok.recv().unwrap_or_else(|_| {
                Err(EngineError::Infer(format!(
                    "tensor-parallel rank {} stopped",
                    r + 1
                )))
            });
            if let Err(e) = got {
                group_err.get_or_insert(e);
            }
        }
        match (lead, group_err) {
            (Ok(lead), None) => Ok(Group {
                lead,
                relay: Some(Box::new(Threads { calls, threads })),
            }),
            // Dropping the senders ends the threads that started.
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        }
    }

    fn tell(&mut self, call: impl Fn() -> Call) {
        if let Some(r) = &mut self.relay {
            r.tell(&call());
        }
    }

    pub fn new_sequence(&mut self) -> SeqId {
        self.tell(|| Call::NewSequence);
        self.lead.new_sequence()
    }

    pub fn prefill(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.tell(|| Call::Prefill(id, tokens.to_vec()));
        self.lead.prefill(id, tokens, logits)
    }

    pub fn decode(
        &mut self,
        ids: &[SeqId],
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.tell(|| Call::Decode(ids.to_vec(), tokens.to_vec()));
        self.lead.decode(ids, tokens, logits)
    }

    pub fn fork(&mut self, id: SeqId) -> SeqId {
        self.tell(|| Call::Fork(id));
        self.lead.fork(id)
    }

    pub fn free(&mut self, id: SeqId) {
        self.tell(|| Call::Free(id));
        self.lead.free(id)
    }

    /// A shipped sequence's KV (prefill/decode disaggregation), into a group of one: a
    /// tensor-parallel group would need each rank's heads shipped apart.
    pub fn import_kv(&mut self, len: usize, bytes: &[u8]) -> Result<SeqId, EngineError> {
        if self.relay.is_some() {
            return Err(EngineError::Infer(
                "shipped KV goes to a single decode worker, not a tensor-parallel group".into(),
            ));
        }
        self.lead.import_kv(len, bytes)
    }

    /// Ends the group: every rank's measured bytes, in rank order.
    pub fn finish(self) -> Vec<Measured> {
        let mut out = vec![self.lead.measured()];
        if let Some(r) = self.relay {
            out.extend(r.end());
        }
        out
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        1 + self.relay.as_ref().map_or(0, |r| r.ranks())
    }
}

/// Reads (the plan, the setup, free blocks) go to rank 0's worker; every rank's are the same
/// but for its share's bytes.
impl std::ops::Deref for Group {
    type Target = Worker;
    fn deref(&self) -> &Worker {
        &self.lead
    }
}

/// A rank other than 0: builds its worker, says whether it started, then repeats the calls
/// until the group ends, returning its measured bytes.
fn follow(
    config: ModelConfig,
    setup: ServeSetup,
    comm: Box<dyn comm::Collective>,
    load: Load,
    ready: mpsc::Sender<Result<(), EngineError>>,
    calls: mpsc::Receiver<Call>,
) -> Measured {
    let built = Worker::tensor_parallel(cpu::Cpu::new(), config, setup, comm, None)
        .and_then(|mut w| load(&mut w).map(|()| w));
    let mut worker = match built {
        Ok(w) => {
            let _ = ready.send(Ok(()));
            w
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return Measured::default();
        }
    };
    let mut logits = Vec::new();
    for call in calls {
        call.apply(&mut worker, &mut logits);
    }
    worker.measured()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_cross_as_bytes_and_malformed_bytes_are_refused() {
        let calls = [
            Call::NewSequence,
            Call::Prefill(SeqId(3), vec![1, 2, 49151]),
            Call::Decode(vec![SeqId(0), SeqId(7)], vec![11, 12]),
            Call::Decode(Vec::new(), Vec::new()),
            Call::Fork(SeqId(2)),
            Call::Free(SeqId(9)),
        ];
        for c in &calls {
            assert_eq!(Call::from_bytes(&c.to_bytes()).as_ref(), Some(c));
        }
        assert_eq!(Call::from_bytes(&[]), None);
        assert_eq!(Call::from_bytes(&[1, 2, 3]), None);
        assert_eq!(Call::from_bytes(&9u64.to_le_bytes()), None);
        // A decode that claims more sequences than it carries.
        let short: Vec<u8> = [2u64, 5, 1].iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(Call::from_bytes(&short), None);
    }
}
