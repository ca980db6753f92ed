//! The `Collective` trait every backend implements, and the plain data it speaks: element
//! buffers (`Buf`, `BufMut`), `ReduceOp`, `DType`.
//!
//! Holds no backend. The trait is object-safe (the engine may hold a `Box<dyn Collective>`) and
//! every buffer is a plain slice of f32 or bf16, so an MPI or NCCL backend maps each call onto
//! one library call (`MPI_Allreduce`, `ncclReduceScatter`, ...) with a datatype taken from `DType`.
//!
//! ```
//! use comm::{Collective, InProcess, ReduceOp};
//! let handles = InProcess::world(2).unwrap();
//! let sums: Vec<f32> = std::thread::scope(|s| {
//!     let joins: Vec<_> = handles
//!         .into_iter()
//!         .map(|mut c| {
//!             s.spawn(move || {
//!                 let mut buf = vec![c.rank() as f32 + 1.0; 4];
//!                 c.all_reduce(buf.as_mut_slice().into(), ReduceOp::Sum).unwrap();
//!                 buf[0]
//!             })
//!         })
//!         .collect();
//!     joins.into_iter().map(|j| j.join().unwrap()).collect()
//! });
//! assert_eq!(sums, vec![3.0, 3.0]);
//! ```

use crate::{CommError, Result};
use half::bf16;
use std::fmt;

/// How elements from different ranks combine. Every backend reduces in rank order
/// (rank 0 first), accumulating bf16 in f32 and rounding once at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum in rank order.
    Sum,
    /// Sum in rank order, then divide by the world size (in f32, before rounding bf16).
    Avg,
    /// Maximum; a NaN on any rank makes the result NaN (so overflow checks cannot miss it).
    Max,
}

impl ReduceOp {
    /// The name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
        }
    }
}

/// Element types a collective can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

/// A read-only buffer of one element type.
#[derive(Debug, Clone, Copy)]
pub enum Buf<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A writable buffer of one element type.
#[derive(Debug)]
pub enum BufMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

impl Buf<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            Buf::F32(_) => DType::F32,
            Buf::Bf16(_) => DType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buf::F32(s) => s.len(),
            Buf::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}

impl BufMut<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            BufMut::F32(_) => DType::F32,
            BufMut::Bf16(_) => DType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            BufMut::F32(s) => s.len(),
            BufMut::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}

impl<'a> From<&'a [f32]> for Buf<'a> {
    fn from(s: &'a [f32]) -> Self {
        Buf::F32(s)
    }
}

impl<'a> From<&'a [bf16]> for Buf<'a> {
    fn from(s: &'a [bf16]) -> Self {
        Buf::Bf16(s)
    }
}

impl<'a> From<&'a mut [f32]> for BufMut<'a> {
    fn from(s: &'a mut [f32]) -> Self {
        BufMut::F32(s)
    }
}

impl<'a> From<&'a mut [bf16]> for BufMut<'a> {
    fn from(s: &'a mut [bf16]) -> Self {
        BufMut::Bf16(s)
    }
}

/// The collectives, for statistics and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Barrier,
    /// `Collective::split`: every rank names its group; nothing is counted.
    Split,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 6] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
        CollectiveKind::Split,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Split => "split",
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A collective started with [`Collective::start_all_gather`], to be finished by
/// [`Collective::wait`]. Tickets of one endpoint finish in the order they were issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a started collective must be waited for before its buffers are used"]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// A collective that finished before its start returned (every blocking backend's).
    pub const DONE: Ticket = Ticket(0);
}

/// One rank's endpoint in a world of `world_size()` ranks.
///
/// Every rank must make the same sequence of calls with the same element type, lengths, op and
/// root; a backend detects a divergence (as `CommError::Mismatch` or `Timeout`) instead of
/// corrupting data. After any error the world is failed and every later call errors too.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// In place: every rank ends with `op` over all ranks' `buf` (element-wise, rank order).
    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;

    /// `input` (world × shard) → `output` (shard): rank r gets `op` over all ranks'
    /// `input[r·shard .. (r+1)·shard]`. `input.len()` must equal `world_size() × output.len()`.
    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()>;

    /// `input` (shard) → `output` (world × shard): `output[r·shard ..]` is rank r's input.
    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()>;

    /// `reduce_scatter` without a separate output: `buf` (world × shard) in, this rank's
    /// reduced shard out in `buf[rank·shard .. (rank+1)·shard]`. The rest of `buf` is
    /// unspecified afterwards (NCCL's in-place form; saves a shard buffer in ZeRO 1-2).
    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;

    /// `all_gather` without a separate input: this rank's shard is already in
    /// `buf[rank·shard .. (rank+1)·shard]`; afterwards `buf` holds every rank's shard
    /// (NCCL's in-place form; ZeRO gathers updated weights into the full unit this way).
    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()>;

    /// Every rank's `buf` becomes a copy of rank `root`'s.
    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// Point-to-point: hands `bytes` to rank `dest`, which takes them with [`recv_bytes`]
    /// (messages between two ranks arrive in the order sent). Buffered where the backend can
    /// (in process: always; MPI: as its eager limit allows), so a sender may run ahead of its
    /// receiver. Only these two ranks take part.
    ///
    /// [`recv_bytes`]: Collective::recv_bytes
    fn send_bytes(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        let _ = (bytes, dest);
        Err(no_point_to_point(self.rank(), "send"))
    }

    /// Point-to-point: the next message from rank `src` into `out`, whose length must be the
    /// message's; waits up to the world's timeout.
    fn recv_bytes(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        let _ = (out, src);
        Err(no_point_to_point(self.rank(), "recv"))
    }

    /// Fails the world: every rank's pending and future calls return `CommError::Aborted`.
    fn abort(&self, reason: &str);

    /// Splits the world into groups (MPI's `MPI_Comm_split`): a collective every rank calls,
    /// each naming its group by `color`; inside a group ranks are ordered by `key`, then by
    /// their rank here. Returns this rank's endpoint in its group, a world of its own (TP, PP
    /// and DP groups are made this way). The parent stays usable.
    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>>;

    /// `all_gather` that may still be running when it returns: the transfer goes on beside the
    /// caller until [`Collective::wait`] on the ticket (`comm::Overlapped` runs it on its own
    /// thread). Calls made meanwhile are queued behind it, in order. By default it is the
    /// blocking `all_gather` and returns [`Ticket::DONE`].
    ///
    /// # Safety
    /// Until `wait(ticket)` returns (or the endpoint is dropped), `input` and `output` stay
    /// allocated, nothing writes `input`, and nothing reads or writes `output`.
    unsafe fn start_all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<Ticket> {
        self.all_gather(input, output).map(|()| Ticket::DONE)
    }

    /// Blocks until the collective `ticket` names (and every one started before it) is done;
    /// its error, or the world's failure since, if any.
    fn wait(&mut self, ticket: Ticket) -> Result<()> {
        let _ = ticket;
        Ok(())
    }

    /// One f32 reduced over all ranks, e.g. the squared gradient norm of each rank's shard.
    fn all_reduce_f32(&mut self, value: f32, op: ReduceOp) -> Result<f32> {
        let mut buf = [value];
        self.all_reduce(BufMut::F32(&mut buf), op)?;
        Ok(buf[0])
    }

    /// True on every rank if `flag` is true on any rank, e.g. "found inf/NaN in my gradients".
    fn any(&mut self, flag: bool) -> Result<bool> {
        let max = self.all_reduce_f32(if flag { 1.0 } else { 0.0 }, ReduceOp::Max)?;
        Ok(max > 0.0)
    }

    /// Every rank's `values` (the same length on every rank), in rank order: exact integers
    /// (byte counts for a report), carried as the bits of bf16 words, which a gather copies and
    /// never rounds. Allocates; not for a training step's hot path.
    fn all_gather_u64(&mut self, values: &[u64]) -> Result<Vec<u64>> {
        let words: Vec<bf16> = values
            .iter()
            .flat_map(|v| (0..4).map(move |i| bf16::from_bits((v >> (16 * i)) as u16)))
            .collect();
        let mut all = vec![bf16::ZERO; words.len() * self.world_size()];
        self.all_gather(Buf::Bf16(&words), BufMut::Bf16(&mut all))?;
        Ok(all
            .chunks_exact(4)
            .map(|w| (0..4).fold(0u64, |v, i| v | (u64::from(w[i].to_bits()) << (16 * i))))
            .collect())
    }
}

/// Boxed endpoints are collectives too (`Counted<Box<dyn Collective>>`, sub-groups).
impl<C: Collective + ?Sized> Collective for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        (**self).all_reduce(buf, op)
    }
    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        (**self).reduce_scatter(input, output, op)
    }
    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        (**self).all_gather(input, output)
    }
    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        (**self).reduce_scatter_in_place(buf, op)
    }
    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()> {
        (**self).all_gather_in_place(buf)
    }
    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn send_bytes(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        (**self).send_bytes(bytes, dest)
    }
    fn recv_bytes(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        (**self).recv_bytes(out, src)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
    fn abort(&self, reason: &str) {
        (**self).abort(reason)
    }
    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>> {
        (**self).split(color, key)
    }
    unsafe fn start_all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<Ticket> {
        (**self).start_all_gather(input, output)
    }
    fn wait(&mut self, ticket: Ticket) -> Result<()> {
        (**self).wait(ticket)
    }
}

/// What a backend without point-to-point transfers answers (a world of one has no peer).
fn no_point_to_point(rank: usize, op: &'static str) -> CommError {
    CommError::BadArgs {
        rank,
        op,
        detail: "this communicator has no point-to-point transfers (in-process and MPI ranks \
                 have them; a world of one has no other rank)"
            .into(),
    }
}
