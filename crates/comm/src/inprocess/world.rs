//! The state the in-process ranks share: who has arrived at which collective, the buffer
//! addresses they posted, and the world's failure, behind one mutex and condvar.
//!
//! Holds synchronisation only; the data movement is in `inprocess::rank`. Two kinds of barrier:
//! - `arrive`, the entry of every collective: bounded by the timeout, aborted by a failure,
//!   checks that every rank makes the same call, and publishes every rank's buffer addresses.
//! - `sync`, between the phases inside a collective: unbounded and deaf to failures, because
//!   once every rank has arrived, all of them run only this crate's non-blocking copy loops,
//!   and a rank must not return (freeing its buffers) while another may still read them.
//!
//! ```text
//! rank 0: arrive ──► reduce own shard ──► sync ──► gather ──► sync ──► return
//! rank 1: arrive ──► reduce own shard ──► sync ──► gather ──► sync ──► return
//! ```

use crate::{CollectiveKind, CommError, DType, ReduceOp, Result};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a rank asked for, compared across ranks before any data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub kind: CollectiveKind,
    pub idx: u64,
    pub dtype: DType,
    pub in_len: usize,
    pub out_len: usize,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{} (", self.kind, self.idx)?;
        match self.kind {
            CollectiveKind::Barrier | CollectiveKind::Split => {}
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => {
                write!(f, "{} × {}", self.dtype.name(), self.in_len)?
            }
            _ => write!(
                f,
                "{} × {} in, {} out",
                self.dtype.name(),
                self.in_len,
                self.out_len
            )?,
        }
        if let Some(op) = self.op {
            write!(f, ", {}", op.name())?;
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        f.write_str(")")
    }
}

/// A rank's call plus the addresses of its buffers (as usize so the state is `Send`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Post {
    pub call: Call,
    pub src: usize,
}

struct State {
    failure: Option<CommError>,
    /// Bumped each time a barrier (either kind) completes.
    generation: u64,
    /// Ranks counted at the barrier in progress.
    count: usize,
    /// Per rank: its post at the arrival in progress, `None` if it has not arrived.
    arriving: Vec<Option<Post>>,
    /// The posts of the last completed arrival. Overwritten only when the next arrival
    /// completes, which needs every rank, so each rank reads it before it can change.
    round: Vec<Option<Post>>,
}

/// Messages by (from, to), oldest first.
type Mailboxes = HashMap<(usize, usize), VecDeque<Vec<u8>>>;

pub(crate) struct World {
    pub n_ranks: usize,
    pub timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
    /// Sub-worlds being made by a `split`, by (call index, color): the first rank of a group in
    /// creates it, the others join it.
    groups: Mutex<HashMap<(u64, u32), Arc<World>>>,
    /// Point-to-point messages in flight, by (from, to), oldest first.
    mail: Mutex<Mailboxes>,
    mail_changed: Condvar,
}

impl World {
    pub fn new(n_ranks: usize, timeout: Duration) -> World {
        World {
            n_ranks,
            // Clamped so `Instant::now() + timeout` cannot overflow ("wait forever" = a year).
            timeout: timeout.min(Duration::from_secs(365 * 24 * 3600)),
            state: Mutex::new(State {
                failure: None,
                generation: 0,
                count: 0,
                arriving: vec![None; n_ranks],
                round: vec![None; n_ranks],
            }),
            changed: Condvar::new(),
            groups: Mutex::new(HashMap::new()),
            mail: Mutex::new(HashMap::new()),
            mail_changed: Condvar::new(),
        }
    }

    /// The sub-world of `size` ranks that split call `idx` makes for `color`.
    pub fn group(&self, idx: u64, color: u32, size: usize) -> Arc<World> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let timeout = self.timeout;
        Arc::clone(
            groups
                .entry((idx, color))
                .or_insert_with(|| Arc::new(World::new(size, timeout))),
        )
    }

    /// Drops the registry's handle once every rank of the split holds its own.
    pub fn forget_group(&self, idx: u64, color: u32) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.remove(&(idx, color));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code holding this lock panics; if it ever did, the state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the world's first failure and wakes every waiter.
    pub fn fail(&self, err: CommError) {
        let mut st = self.lock();
        if st.failure.is_none() {
            st.failure = Some(err);
        }
        drop(st);
        self.changed.notify_all();
        // A receiver waiting for mail learns of the failure too.
        let _mail = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        self.mail_changed.notify_all();
    }

    /// Leaves `bytes` for `to` from `from` (a buffered send).
    pub fn post(&self, from: usize, to: usize, bytes: Vec<u8>) -> Result<()> {
        if let Some(err) = &self.lock().failure {
            return Err(err.clone());
        }
        let mut mail = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        mail.entry((from, to)).or_default().push_back(bytes);
        drop(mail);
        self.mail_changed.notify_all();
        Ok(())
    }

    /// The oldest message from `from` to `to`, waiting up to the timeout.
    pub fn take(&self, from: usize, to: usize) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let mut mail = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(m) = mail.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            if let Some(err) = &self.lock().failure {
                return Err(err.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                let err = CommError::Timeout {
                    op: "recv",
                    call_idx: 0,
                    late: vec![from],
                    timeout: self.timeout,
                    detected_by: to,
                };
                drop(mail);
                self.fail(err.clone());
                return Err(err);
            }
            mail = self
                .mail_changed
                .wait_timeout(mail, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Enters a collective. On success `posts_out` holds every rank's post (index = rank).
    pub fn arrive(&self, rank: usize, post: Post, posts_out: &mut Vec<Post>) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.lock();
        if let Some(err) = &st.failure {
            return Err(err.clone());
        }
        st.arriving[rank] = Some(post);
        st.count += 1;
        if st.count == self.n_ranks {
            return self.complete_arrival(st, rank, posts_out);
        }
        let generation = st.generation;
        loop {
            let now = Instant::now();
            if now >= deadline {
                let late: Vec<usize> = (0..self.n_ranks)
                    .filter(|&r| st.arriving[r].is_none())
                    .collect();
                let err = CommError::Timeout {
                    op: post.call.kind.name(),
                    call_idx: post.call.idx,
                    late,
                    timeout: self.timeout,
                    detected_by: rank,
                };
                st.failure.get_or_insert(err);
                return Err(self.withdraw(st, rank));
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            // A completed arrival wins over a failure that came after it.
            if st.generation != generation {
                copy_round(&st.round, posts_out);
                return Ok(());
            }
            if st.failure.is_some() {
                return Err(self.withdraw(st, rank));
            }
        }
    }

    /// The last rank in: checks the calls match, then releases everyone.
    fn complete_arrival(
        &self,
        mut st: MutexGuard<'_, State>,
        rank: usize,
        posts_out: &mut Vec<Post>,
    ) -> Result<()> {
        let first = st.arriving[0].expect("every rank has arrived").call;
        for r in 1..self.n_ranks {
            let call = st.arriving[r].expect("every rank has arrived").call;
            if call != first {
                let err = CommError::Mismatch {
                    rank_a: 0,
                    call_a: first.to_string(),
                    rank_b: r,
                    call_b: call.to_string(),
                };
                st.failure.get_or_insert(err);
                return Err(self.withdraw(st, rank));
            }
        }
        let st = &mut *st;
        st.round.clone_from_slice(&st.arriving);
        st.arriving.iter_mut().for_each(|p| *p = None);
        st.count = 0;
        st.generation += 1;
        copy_round(&st.round, posts_out);
        self.changed.notify_all();
        Ok(())
    }

    /// Takes a rank back out of an arrival that will never complete; returns the failure.
    fn withdraw(&self, mut st: MutexGuard<'_, State>, rank: usize) -> CommError {
        st.arriving[rank] = None;
        st.count -= 1;
        let err = st.failure.clone().expect("withdraw only after a failure");
        drop(st);
        self.changed.notify_all();
        err
    }

    /// A barrier between phases of one collective. No timeout and no failure check: see the
    /// module docs for why waiting here is both bounded and required.
    pub fn sync(&self) {
        let mut st = self.lock();
        st.count += 1;
        if st.count == self.n_ranks {
            st.count = 0;
            st.generation += 1;
            drop(st);
            self.changed.notify_all();
            return;
        }
        let generation = st.generation;
        while st.generation == generation {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn copy_round(round: &[Option<Post>], out: &mut Vec<Post>) {
    out.clear();
    out.extend(
        round
            .iter()
            .map(|p| p.expect("a completed round has every post")),
    );
}
