//! `Overlapped`: any endpoint moved onto a thread of its own, so a collective started with
//! [`Collective::start_all_gather`] runs while the caller computes, and [`Collective::wait`]
//! blocks only for what is left of it (a CUDA stream's order, as NCCL's collectives on a side
//! stream; DeepSpeed's `overlap_comm` for the ZeRO-3 prefetch).
//!
//! Every call, blocking or started, is queued to that thread and run in the order it was made,
//! so each rank's call sequence is exactly what it would be without the thread: the backends
//! below keep their contract (rank order, timeouts, failure of the world) unchanged, and a
//! blocking call made while a gather is in flight first waits for the gather. Nothing is
//! staged: a job carries the caller's buffer addresses, which is why starting is `unsafe` (the
//! caller keeps the buffers alive and untouched until its `wait`). The queue is allocated once;
//! a call allocates nothing.
//!
//! The inner endpoint must tolerate being called from a thread other than the one that made it:
//! `InProcess` and `Solo` do; `Mpi` does when MPI granted `MPI_THREAD_MULTIPLE`
//! (`Mpi::thread_multiple`). `abort` runs on the endpoint's thread too, after the call in
//! progress (which the backend's own timeout bounds). Dropping the endpoint runs what is queued,
//! then drops the inner endpoint on its thread.
//!
//! ```
//! use comm::{Collective, InProcess, Overlapped};
//! let ranks = InProcess::world(2).unwrap();
//! let got: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let joins: Vec<_> = ranks
//!         .into_iter()
//!         .map(|c| {
//!             s.spawn(move || {
//!                 let mut c = Overlapped::new(Box::new(c));
//!                 let mine = [c.rank() as f32 + 1.0];
//!                 let mut all = [0.0f32; 2];
//!                 // SAFETY: `mine` and `all` outlive the wait and are not touched before it.
//!                 let t = unsafe { c.start_all_gather(mine.as_slice().into(), all.as_mut_slice().into()) }.unwrap();
//!                 let busy: f32 = (0..1000).map(|i| i as f32).sum(); // compute meanwhile
//!                 c.wait(t).unwrap();
//!                 assert!(busy > 0.0);
//!                 all.to_vec()
//!             })
//!         })
//!         .collect();
//!     joins.into_iter().map(|j| j.join().unwrap()).collect()
//! });
//! assert!(got.iter().all(|v| v == &[1.0, 2.0]));
//! ```

use crate::{Buf, BufMut, Collective, CommError, ReduceOp, Result, Ticket};
use half::bf16;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A buffer's address, element type and length, as a job carries it to the endpoint's thread.
#[derive(Clone, Copy)]
enum Raw {
    F32(*mut f32, usize),
    Bf16(*mut bf16, usize),
}

impl Raw {
    fn of(b: Buf<'_>) -> Raw {
        match b {
            Buf::F32(s) => Raw::F32(s.as_ptr() as *mut f32, s.len()),
            Buf::Bf16(s) => Raw::Bf16(s.as_ptr() as *mut bf16, s.len()),
        }
    }

    fn of_mut(b: BufMut<'_>) -> Raw {
        match b {
            BufMut::F32(s) => Raw::F32(s.as_mut_ptr(), s.len()),
            BufMut::Bf16(s) => Raw::Bf16(s.as_mut_ptr(), s.len()),
        }
    }

    /// # Safety
    /// The buffer this was made from is alive and read by no one else for `'a`.
    unsafe fn buf<'a>(self) -> Buf<'a> {
        match self {
            Raw::F32(p, n) => Buf::F32(std::slice::from_raw_parts(p, n)),
            Raw::Bf16(p, n) => Buf::Bf16(std::slice::from_raw_parts(p, n)),
        }
    }

    /// # Safety
    /// The buffer this was made from is alive and used by no one else for `'a`.
    unsafe fn buf_mut<'a>(self) -> BufMut<'a> {
        match self {
            Raw::F32(p, n) => BufMut::F32(std::slice::from_raw_parts_mut(p, n)),
            Raw::Bf16(p, n) => BufMut::Bf16(std::slice::from_raw_parts_mut(p, n)),
        }
    }
}

/// One queued call.
enum Job {
    AllReduce(Raw, ReduceOp),
    ReduceScatter(Raw, Raw, ReduceOp),
    AllGather(Raw, Raw),
    ReduceScatterInPlace(Raw, ReduceOp),
    AllGatherInPlace(Raw),
    Broadcast(Raw, usize),
    Barrier,
    Split(u32, u32),
    Abort(String),
}

// SAFETY: a job's addresses are used only by the endpoint's thread, while the caller keeps the
// buffers alive and untouched (a blocking call waits for its job; a started one until `wait`).
unsafe impl Send for Job {}

/// What the caller and the endpoint's thread share.
struct State {
    queue: VecDeque<Job>,
    /// Jobs finished (run, or refused after a failure), in queue order.
    done: u64,
    /// The first failure: every later job is refused with it.
    failed: Option<CommError>,
    /// `split`'s result, handed back to the caller that waits for it.
    split: Option<Box<dyn Collective>>,
    /// Set by `drop`: run what is queued, then end.
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Whether the caller is blocked in a call or a `wait` (rather than computing).
    waiting: AtomicBool,
}

thread_local! {
    /// On an endpoint's thread: what it shares with its caller.
    static CALLER: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
}

/// Whether this thread runs an `Overlapped` endpoint whose caller is computing rather than
/// waiting for it: a backend that must poll its transfer (MPI) may then poll lazily, leaving
/// the core to that computation, and polls hot as soon as the caller waits.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn caller_busy() -> bool {
    CALLER.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|s| !s.waiting.load(Ordering::Relaxed))
    })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code holding this lock panics; if it ever did, the state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An endpoint whose calls run on a thread of its own, in order.
pub struct Overlapped {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    rank: usize,
    world: usize,
    /// Jobs queued so far (a ticket is the count after its job).
    queued: u64,
}

impl Overlapped {
    /// Moves `inner` onto a thread of its own.
    pub fn new(inner: Box<dyn Collective>) -> Overlapped {
        let (rank, world) = (inner.rank(), inner.world_size());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(16),
                done: 0,
                failed: None,
                split: None,
                stop: false,
            }),
            changed: Condvar::new(),
            waiting: AtomicBool::new(false),
        });
        let theirs = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("comm-{rank}"))
            .spawn(move || {
                CALLER.with(|c| *c.borrow_mut() = Some(Arc::clone(&theirs)));
                run(inner, &theirs)
            })
            .expect("the OS starts a thread");
        Overlapped {
            shared,
            worker: Some(worker),
            rank,
            world,
            queued: 0,
        }
    }

    fn submit(&mut self, job: Job) -> Result<Ticket> {
        let mut st = self.shared.lock();
        if let Some(err) = &st.failed {
            return Err(err.clone());
        }
        st.queue.push_back(job);
        drop(st);
        self.shared.changed.notify_all();
        self.queued += 1;
        Ok(Ticket(self.queued))
    }

    /// Queues `job` and waits for it: a blocking call.
    fn call(&mut self, job: Job) -> Result<()> {
        let t = self.submit(job)?;
        self.wait(t)
    }
}

/// The endpoint's thread: runs jobs in order until dropped with nothing queued.
fn run(mut inner: Box<dyn Collective>, shared: &Shared) {
    let mut st = shared.lock();
    loop {
        let Some(job) = st.queue.pop_front() else {
            if st.stop {
                break;
            }
            st = shared.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let refused = st.failed.clone();
        drop(st);
        let mut split = None;
        let result = match refused {
            Some(err) => Err(err),
            // SAFETY: the caller keeps every buffer alive and untouched until this job is done.
            // A panic below becomes the world's failure, so no waiter waits for a dead thread.
            None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                execute(&mut *inner, job, &mut split)
            }))
            .unwrap_or_else(|_| {
                Err(CommError::Aborted {
                    rank: inner.rank(),
                    reason: "its communication thread panicked".into(),
                })
            }),
        };
        st = shared.lock();
        st.done += 1;
        if let Err(err) = result {
            st.failed.get_or_insert(err);
        }
        if split.is_some() {
            st.split = split;
        }
        shared.changed.notify_all();
    }
    drop(st);
    drop(inner);
}

/// # Safety
/// The job's buffers are alive and used by no one else until this returns.
unsafe fn execute(
    c: &mut dyn Collective,
    job: Job,
    split: &mut Option<Box<dyn Collective>>,
) -> Result<()> {
    match job {
        Job::AllReduce(b, op) => c.all_reduce(b.buf_mut(), op),
        Job::ReduceScatter(i, o, op) => c.reduce_scatter(i.buf(), o.buf_mut(), op),
        Job::AllGather(i, o) => c.all_gather(i.buf(), o.buf_mut()),
        Job::ReduceScatterInPlace(b, op) => c.reduce_scatter_in_place(b.buf_mut(), op),
        Job::AllGatherInPlace(b) => c.all_gather_in_place(b.buf_mut()),
        Job::Broadcast(b, root) => c.broadcast(b.buf_mut(), root),
        Job::Barrier => c.barrier(),
        Job::Split(color, key) => {
            *split = Some(c.split(color, key)?);
            Ok(())
        }
        Job::Abort(reason) => {
            c.abort(&reason);
            Err(CommError::Aborted {
                rank: c.rank(),
                reason,
            })
        }
    }
}

impl Collective for Overlapped {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.call(Job::AllReduce(Raw::of_mut(buf), op))
    }

    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.call(Job::ReduceScatter(Raw::of(input), Raw::of_mut(output), op))
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        self.call(Job::AllGather(Raw::of(input), Raw::of_mut(output)))
    }

    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.call(Job::ReduceScatterInPlace(Raw::of_mut(buf), op))
    }

    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()> {
        self.call(Job::AllGatherInPlace(Raw::of_mut(buf)))
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        self.call(Job::Broadcast(Raw::of_mut(buf), root))
    }

    fn barrier(&mut self) -> Result<()> {
        self.call(Job::Barrier)
    }

    fn abort(&self, reason: &str) {
        let mut st = self.shared.lock();
        // First in line: it runs as soon as the call in progress returns.
        st.queue.push_front(Job::Abort(reason.to_string()));
        drop(st);
        self.shared.changed.notify_all();
    }

    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>> {
        self.call(Job::Split(color, key))?;
        let mut st = self.shared.lock();
        Ok(st.split.take().expect("a finished split left its endpoint"))
    }

    unsafe fn start_all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<Ticket> {
        self.submit(Job::AllGather(Raw::of(input), Raw::of_mut(output)))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<()> {
        let mut st = self.shared.lock();
        if st.done < ticket.0 {
            self.shared.waiting.store(true, Ordering::Relaxed);
            while st.done < ticket.0 {
                st = self
                    .shared
                    .changed
                    .wait(st)
                    .unwrap_or_else(|e| e.into_inner());
            }
            self.shared.waiting.store(false, Ordering::Relaxed);
        }
        match &st.failed {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Overlapped {
    /// Runs what is queued (a started gather's buffers are the caller's until then), then ends
    /// the thread, which drops the inner endpoint (failing its world, as any dropped endpoint).
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
