//! Ranks as processes over MPI (the `mpi` feature, rsmpi on the system's MPI library; `.ci/run`
//! uses MPICH): one [`Mpi`] endpoint per process, `mpirun -n N frugal train --comm mpi`.
//!
//! **Same bits as thread ranks.** MPI's own reductions promise no order, so none is used: a
//! reduce-scatter is one `MPI_Ialltoall` (every rank sends shard r of its buffer to rank r) and a
//! local reduction of the N received shards in rank order with the kernel `InProcess` uses
//! (`reduce::reduce_into`: f32 accumulation, bf16 widened exactly and rounded once); an
//! all-reduce is that reduce-scatter then an `MPI_Iallgather` of the reduced shards (a buffer
//! that does not split evenly is padded to N equal shards in scratch). Each rank sends
//! (N−1)/N of the buffer in each half, the ring model `Counted` counts: 2Ψ(N−1)/N per
//! all-reduce. bf16 travels as its 16 bits (MPI has no bf16 type) and is only added locally.
//!
//! **Threads.** MPI is initialised asking for `MPI_THREAD_MULTIPLE`, so an endpoint may move to
//! another thread (`Overlapped`: the ZeRO-3 prefetch runs on a communication thread while the
//! main thread uses the tensor- and pipeline-parallel groups); [`Mpi::thread_multiple`] says
//! whether the library granted it (MPICH does). Each endpoint is used by one thread at a time;
//! the engine's rayon workers never call MPI.
//!
//! **Never a hang.** Every collective is non-blocking and polled against the timeout (hot, but
//! every 50 µs on an `Overlapped` thread while its caller computes); a rank
//! that waits longer prints which call it was stuck in and calls `MPI_Abort`, which ends every
//! process of the job (the launcher reports each one's exit). A process that dies is reported by
//! the launcher (MPICH's `mpiexec` names its rank and ends the others). MPI cannot tell a
//! mismatched call sequence from a slow rank: mismatches surface as that timeout.
//!
//! Example: `let comm = comm::Mpi::init(Duration::from_secs(60), report)?;` under `mpirun`.

mod p2p;

use crate::reduce::{reduce_into, Elem};
use crate::{Buf, BufMut, Collective, CollectiveKind, CommError, ReduceOp, Result};
use half::bf16;
use mpi::collective::{CommunicatorCollectives, Root};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The MPI environment: initialised once per process, finalised by [`Mpi::finalize`].
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

/// Whether MPI granted `MPI_THREAD_MULTIPLE` at [`Mpi::init`].
static MULTIPLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One process's endpoint in an MPI communicator.
pub struct Mpi {
    comm: SimpleCommunicator,
    /// A duplicate of `comm` for the liveness probe after a timeout (its messages never meet
    /// a collective's).
    side: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    calls: u64,
    /// Says why this process is about to end the job (the caller prints; this crate never does).
    report: fn(&str),
    /// Reusable staging: the shards received from every rank, and padded sends.
    recv_f32: Vec<f32>,
    send_f32: Vec<f32>,
    recv_bf16: Vec<bf16>,
    send_bf16: Vec<bf16>,
}

// SAFETY: an endpoint is used by one thread at a time and never shared; it moves to another
// thread (`Overlapped`) only where MPI granted MPI_THREAD_MULTIPLE (`Mpi::thread_multiple`).
unsafe impl Send for Mpi {}

/// bf16 as the 16-bit words MPI carries.
fn words(x: &[bf16]) -> &[u16] {
    // SAFETY: half::bf16 is repr(transparent) over u16.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u16, x.len()) }
}

fn words_mut(x: &mut [bf16]) -> &mut [u16] {
    // SAFETY: as `words`.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u16, x.len()) }
}

impl Mpi {
    /// Initialises MPI (once per process) and returns this process's endpoint in the world, every
    /// collective bounded by `timeout`; `report` receives the reason before a timeout or `abort`
    /// ends the job. Outside `mpirun` it is a world of one.
    pub fn init(timeout: Duration, report: fn(&str)) -> Result<Mpi> {
        let mut universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
        if universe.is_none() {
            let (u, granted) = mpi::initialize_with_threading(mpi::Threading::Multiple).ok_or(
                CommError::BadArgs {
                    rank: 0,
                    op: "init",
                    detail: "MPI was already initialised outside frugal".into(),
                },
            )?;
            let multiple = granted == mpi::Threading::Multiple;
            MULTIPLE.store(multiple, std::sync::atomic::Ordering::Relaxed);
            *universe = Some(u);
        }
        let comm = universe.as_ref().expect("initialised").world();
        Ok(Mpi::on(comm, timeout, report))
    }

    fn on(comm: SimpleCommunicator, timeout: Duration, report: fn(&str)) -> Mpi {
        Mpi {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            side: comm.duplicate(),
            comm,
            timeout,
            calls: 0,
            report,
            recv_f32: Vec::new(),
            send_f32: Vec::new(),
            recv_bf16: Vec::new(),
            send_bf16: Vec::new(),
        }
    }

    /// Whether endpoints may be called from threads other than the one that made them (MPI
    /// granted `MPI_THREAD_MULTIPLE`); `comm::Overlapped` needs it.
    pub fn thread_multiple() -> bool {
        MULTIPLE.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many of this world's processes share this one's node (`MPI_COMM_TYPE_SHARED`): a
    /// collective every rank calls.
    pub fn node_ranks(&self) -> usize {
        self.comm.split_shared(self.rank as i32).size() as usize
    }

    /// Finalises MPI (after every endpoint is dropped); a no-op when it was never initialised.
    pub fn finalize() {
        let mut universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
        drop(universe.take());
    }

    /// Ends every process of the job with `code` (MPI_Abort on the world), from anywhere in
    /// this process: a rank whose run failed stops the others instead of leaving them waiting.
    pub fn abort_world(code: i32) {
        let universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = universe.as_ref() {
            // As `abort_job`: let the launcher forward what this process printed first.
            std::thread::sleep(Duration::from_millis(500));
            u.world().abort(code)
        }
    }

    /// Ends every process of the job with `code` after printing `why` (MPI_Abort).
    pub fn abort_job(&self, why: &str, code: i32) -> ! {
        (self.report)(&format!("rank {}: {why}", self.rank));
        // The launcher forwards the processes' output through pipes that MPI_Abort tears down:
        // give it a moment to pass the reason on (seen lost under load otherwise).
        std::thread::sleep(Duration::from_millis(500));
        self.comm.abort(code)
    }

    /// Polls `req` until it completes; past the timeout, aborts the job naming the call.
    fn finish<'a, R: ?Sized, S: Scope<'a>>(&self, req: Request<'a, R, S>, op: &'static str) {
        let deadline = Instant::now() + self.timeout;
        let mut req = req;
        let mut spins = 0u64;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            // MPI progresses a transfer only inside its calls, piece by piece: poll hot, and
            // yield (not sleep) so a long wait still leaves the core to others. A prefetch on a
            // communication thread whose caller is computing polls every 50 µs instead, so it
            // does not wake into that computation thousands of times a millisecond.
            spins += 1;
            if crate::overlapped::caller_busy() {
                std::thread::sleep(Duration::from_micros(50));
            } else if spins % 64 == 0 {
                std::thread::yield_now();
            }
            if Instant::now() >= deadline {
                let late = self.late_ranks();
                let err = match late.is_empty() {
                    true => CommError::Stalled {
                        op,
                        call_idx: self.calls,
                        timeout: self.timeout,
                        detected_by: self.rank,
                    },
                    false => CommError::Timeout {
                        op,
                        call_idx: self.calls,
                        late,
                        timeout: self.timeout,
                        detected_by: self.rank,
                    },
                };
                self.abort_job(&err.to_string(), 3);
            }
        }
    }

    fn check(&self, op: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
        if ok {
            return Ok(());
        }
        Err(CommError::BadArgs {
            rank: self.rank,
            op,
            detail: detail(),
        })
    }

    /// `shards` (N × shard, rank r's at r) → every rank's shard `rank` in rank order in `recv`.
    fn exchange<T: mpi::datatype::Equivalence>(&mut self, send: &[T], recv: &mut [T]) {
        let op = CollectiveKind::ReduceScatter.name();
        mpi::request::scope(|scope| {
            let req = self.comm.immediate_all_to_all_into(scope, send, recv);
            self.finish(req, op);
        });
    }

    fn gather<T: mpi::datatype::Equivalence>(&mut self, send: &[T], recv: &mut [T]) {
        let op = CollectiveKind::AllGather.name();
        mpi::request::scope(|scope| {
            let req = self.comm.immediate_all_gather_into(scope, send, recv);
            self.finish(req, op);
        });
    }
}

/// The element types the backend moves, with their staging buffers.
trait Moved: Elem + Default {
    fn bufs(m: &mut Mpi) -> (&mut Vec<Self>, &mut Vec<Self>);
    fn exchange(m: &mut Mpi, send: &[Self], recv: &mut [Self]);
    fn gather(m: &mut Mpi, send: &[Self], recv: &mut [Self]);
}

impl Moved for f32 {
    fn bufs(m: &mut Mpi) -> (&mut Vec<f32>, &mut Vec<f32>) {
        (&mut m.send_f32, &mut m.recv_f32)
    }
    fn exchange(m: &mut Mpi, send: &[f32], recv: &mut [f32]) {
        m.exchange(send, recv)
    }
    fn gather(m: &mut Mpi, send: &[f32], recv: &mut [f32]) {
        m.gather(send, recv)
    }
}

impl Moved for bf16 {
    fn bufs(m: &mut Mpi) -> (&mut Vec<bf16>, &mut Vec<bf16>) {
        (&mut m.send_bf16, &mut m.recv_bf16)
    }
    fn exchange(m: &mut Mpi, send: &[bf16], recv: &mut [bf16]) {
        m.exchange(words(send), words_mut(recv))
    }
    fn gather(m: &mut Mpi, send: &[bf16], recv: &mut [bf16]) {
        m.gather(words(send), words_mut(recv))
    }
}

/// The staging buffer `v`, taken out of the endpoint, at least `len` long (grown once, never
/// re-zeroed: a collective overwrites what it reads).
fn grown<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> Vec<T> {
    let mut v = std::mem::take(v);
    if v.len() < len {
        v.resize(len, T::default());
    }
    v
}

/// `out` = op over the N rows of `rows` (N × out.len()), in rank order.
fn reduce_rows<T: Elem>(rows: &[T], out: &mut [T], n: usize, op: ReduceOp) {
    let len = out.len();
    let srcs: Vec<usize> = (0..n).map(|k| rows[k * len..].as_ptr() as usize).collect();
    // SAFETY: each source is `len` elements of `rows`, `out` is `len` elements of another buffer.
    unsafe { reduce_into(&srcs, out.as_mut_ptr(), len, op) };
}

impl Mpi {
    /// Reduce-scatter of `input` (N × shard) into `output` (shard).
    fn reduce_scatter_t<T: Moved>(&mut self, input: &[T], output: &mut [T], op: ReduceOp) {
        let n = self.size;
        let mut recv = grown(T::bufs(self).1, input.len());
        T::exchange(self, input, &mut recv[..input.len()]);
        reduce_rows(&recv[..input.len()], output, n, op);
        *T::bufs(self).1 = recv;
    }

    /// All-reduce of `buf` in place, padded to N equal shards when it does not split evenly.
    fn all_reduce_t<T: Moved>(&mut self, buf: &mut [T], op: ReduceOp) {
        let n = self.size;
        if buf.len() % n == 0 {
            // In place: reduce-scatter this rank's shard into `buf`, then gather every shard.
            let shard = buf.len() / n;
            let at = self.rank * shard;
            let mut recv = grown(T::bufs(self).1, buf.len());
            T::exchange(self, buf, &mut recv[..buf.len()]);
            reduce_rows(&recv[..buf.len()], &mut buf[at..at + shard], n, op);
            recv[..shard].copy_from_slice(&buf[at..at + shard]);
            T::gather(self, &recv[..shard], buf);
            *T::bufs(self).1 = recv;
            return;
        }
        let shard = buf.len().div_ceil(n);
        let (send, _) = T::bufs(self);
        let mut send = std::mem::take(send);
        send.clear();
        send.extend_from_slice(buf);
        send.resize(n * shard, T::default());
        let mut mine = vec![T::default(); shard];
        self.reduce_scatter_t(&send, &mut mine, op);
        T::gather(self, &mine, &mut send);
        buf.copy_from_slice(&send[..buf.len()]);
        *T::bufs(self).0 = send;
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.calls += 1;
        match buf {
            BufMut::F32(b) => self.all_reduce_t(b, op),
            BufMut::Bf16(b) => self.all_reduce_t(b, op),
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.calls += 1;
        let n = self.size;
        self.check("reduce_scatter", input.len() == n * output.len(), || {
            format!(
                "input of {} elements is not {n} × output ({})",
                input.len(),
                output.len()
            )
        })?;
        match (input, output) {
            (Buf::F32(i), BufMut::F32(o)) => self.reduce_scatter_t(i, o, op),
            (Buf::Bf16(i), BufMut::Bf16(o)) => self.reduce_scatter_t(i, o, op),
            _ => return self.check("reduce_scatter", false, || "mixed element types".into()),
        }
        Ok(())
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        self.calls += 1;
        let n = self.size;
        self.check("all_gather", output.len() == n * input.len(), || {
            format!(
                "output of {} elements is not {n} × input ({})",
                output.len(),
                input.len()
            )
        })?;
        match (input, output) {
            (Buf::F32(i), BufMut::F32(o)) => f32::gather(self, i, o),
            (Buf::Bf16(i), BufMut::Bf16(o)) => bf16::gather(self, i, o),
            _ => return self.check("all_gather", false, || "mixed element types".into()),
        }
        Ok(())
    }

    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        self.calls += 1;
        let n = self.size;
        self.check("reduce_scatter", buf.len() % n == 0, || {
            format!("{} elements do not split over {n} ranks", buf.len())
        })?;
        let shard = buf.len() / n;
        let at = self.rank * shard;
        fn in_place<T: Moved>(m: &mut Mpi, b: &mut [T], at: usize, shard: usize, op: ReduceOp) {
            let len = b.len();
            let mut recv = grown(T::bufs(m).1, len);
            T::exchange(m, b, &mut recv[..len]);
            reduce_rows(&recv[..len], &mut b[at..at + shard], m.size, op);
            *T::bufs(m).1 = recv;
        }
        match buf {
            BufMut::F32(b) => in_place(self, b, at, shard, op),
            BufMut::Bf16(b) => in_place(self, b, at, shard, op),
        }
        Ok(())
    }

    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()> {
        self.calls += 1;
        let n = self.size;
        self.check("all_gather", buf.len() % n == 0, || {
            format!("{} elements do not split over {n} ranks", buf.len())
        })?;
        let shard = buf.len() / n;
        let at = self.rank * shard;
        fn in_place<T: Moved>(m: &mut Mpi, b: &mut [T], at: usize, shard: usize) {
            let (send, _) = T::bufs(m);
            let mut send = std::mem::take(send);
            send.clear();
            send.extend_from_slice(&b[at..at + shard]);
            T::gather(m, &send, b);
            *T::bufs(m).0 = send;
        }
        match buf {
            BufMut::F32(b) => in_place(self, b, at, shard),
            BufMut::Bf16(b) => in_place(self, b, at, shard),
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        self.calls += 1;
        self.check("broadcast", root < self.size, || {
            format!("root {root} of {}", self.size)
        })?;
        let root = self.comm.process_at_rank(root as i32);
        match buf {
            BufMut::F32(b) => mpi::request::scope(|scope| {
                let req = root.immediate_broadcast_into(scope, b);
                self.finish(req, "broadcast");
            }),
            BufMut::Bf16(b) => mpi::request::scope(|scope| {
                let req = root.immediate_broadcast_into(scope, words_mut(b));
                self.finish(req, "broadcast");
            }),
        }
        Ok(())
    }

    fn send_bytes(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        self.send(bytes, dest)
    }

    fn recv_bytes(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        self.recv(out, src)
    }

    fn barrier(&mut self) -> Result<()> {
        self.calls += 1;
        let req = self.comm.immediate_barrier();
        self.finish(req, "barrier");
        Ok(())
    }

    fn abort(&self, reason: &str) {
        self.abort_job(reason, 3)
    }

    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>> {
        Ok(Box::new(self.split_mpi(color, key)?))
    }
}
