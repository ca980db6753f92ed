//! `InProcessComm`: one rank's handle in an in-process world, implementing `Collective`.
//!
//! Holds the data movement of each collective over the addresses the ranks posted at arrival;
//! synchronisation is in `world`. Shards of an all-reduce of L elements over N ranks are
//! `[r·L/N, (r+1)·L/N)`, so L need not divide by N.
//!
//! Memory safety rests on three rules: a rank reads another's buffer only between the arrival
//! and the final `sync` of the same collective; in that window each byte is written by at most
//! one rank and then only while nobody reads it (phases are separated by `sync`); and a rank
//! never returns before the final `sync`, so its buffers outlive every read. A panic inside a
//! copy loop would break the last rule, so it aborts the process instead (`AbortOnPanic`).
//!
//! ```
//! use comm::{Collective, InProcess};
//! let mut ranks = InProcess::world(1).unwrap();
//! let mut out = [0.0f32; 2];
//! ranks[0].all_gather([1.0f32, 2.0].as_slice().into(), out.as_mut_slice().into()).unwrap();
//! assert_eq!(out, [1.0, 2.0]);
//! ```

use super::world::{Call, Post, World};
use crate::reduce::{reduce_into, Elem};
use crate::{Buf, BufMut, Collective, CollectiveKind, CommError, DType, ReduceOp, Result};
use std::sync::Arc;

pub struct InProcessComm {
    world: Arc<World>,
    rank: usize,
    /// Calls made so far: the index of the next call, compared across ranks.
    n_calls: u64,
    /// Every rank's post at the current collective (reused, so no allocation per call).
    posts: Vec<Post>,
    /// Source addresses handed to the reduction kernel (reused).
    srcs: Vec<usize>,
}

/// Aborts the process if dropped while a panic unwinds out of a region where other ranks
/// may still be reading this rank's buffers (see the module docs).
struct AbortOnPanic {
    was_panicking: bool,
}

impl AbortOnPanic {
    fn new() -> Self {
        AbortOnPanic {
            was_panicking: std::thread::panicking(),
        }
    }
}

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.was_panicking {
            std::process::abort();
        }
    }
}

fn shard_range(len: usize, n: usize, r: usize) -> (usize, usize) {
    (r * len / n, (r + 1) * len / n)
}

impl InProcessComm {
    pub(super) fn new(world: Arc<World>, rank: usize) -> Self {
        let n = world.n_ranks;
        InProcessComm {
            world,
            rank,
            n_calls: 0,
            posts: Vec::with_capacity(n),
            srcs: Vec::with_capacity(n),
        }
    }

    /// The timeout every collective of this world waits for the other ranks.
    pub fn timeout(&self) -> std::time::Duration {
        self.world.timeout
    }

    fn call(&self, kind: CollectiveKind, dtype: DType, in_len: usize, out_len: usize) -> Call {
        Call {
            kind,
            idx: self.n_calls,
            dtype,
            in_len,
            out_len,
            op: None,
            root: None,
        }
    }

    /// Fails the world with a bad-arguments error so the other ranks do not wait for nothing.
    fn bad_args(&self, op: &'static str, detail: String) -> CommError {
        let err = CommError::BadArgs {
            rank: self.rank,
            op,
            detail,
        };
        self.world.fail(err.clone());
        err
    }

    fn arrive(&mut self, call: Call, src: usize) -> Result<()> {
        self.n_calls += 1;
        let post = Post { call, src };
        self.world.arrive(self.rank, post, &mut self.posts)
    }

    fn all_reduce_t<T: Elem>(&mut self, buf: &mut [T], call: Call) -> Result<()> {
        let op = call.op.expect("all_reduce has an op");
        let ptr = buf.as_mut_ptr();
        self.arrive(call, ptr as usize)?;
        let (len, n) = (buf.len(), self.world.n_ranks);
        let guard = AbortOnPanic::new();
        let (lo, hi) = shard_range(len, n, self.rank);
        let elem = std::mem::size_of::<T>();
        self.srcs.clear();
        self.srcs
            .extend(self.posts.iter().map(|p| p.src + lo * elem));
        // SAFETY: every rank's buffer has `len` elements (checked at arrival); in this phase
        // only this rank touches the range [lo, hi) of any buffer, and only its own is written.
        unsafe { reduce_into::<T>(&self.srcs, ptr.add(lo), hi - lo, op) };
        self.world.sync();
        for (k, post) in self
            .posts
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != self.rank)
        {
            let (lo, hi) = shard_range(len, n, k);
            // SAFETY: rank k's shard is final after the sync; nobody writes it now, and this
            // rank's range [lo, hi) is read by nobody in this phase.
            unsafe {
                std::ptr::copy_nonoverlapping((post.src as *const T).add(lo), ptr.add(lo), hi - lo)
            };
        }
        self.world.sync();
        drop(guard);
        Ok(())
    }

    fn reduce_scatter_t<T: Elem>(
        &mut self,
        input: &[T],
        output: &mut [T],
        call: Call,
    ) -> Result<()> {
        let op = call.op.expect("reduce_scatter has an op");
        self.arrive(call, input.as_ptr() as usize)?;
        let guard = AbortOnPanic::new();
        let shard = output.len();
        let offset_bytes = self.rank * shard * std::mem::size_of::<T>();
        self.srcs.clear();
        self.srcs
            .extend(self.posts.iter().map(|p| p.src + offset_bytes));
        // SAFETY: inputs are read-only for the whole collective and have world × shard
        // elements (checked at arrival); `output` is this rank's own and shared with nobody.
        unsafe { reduce_into::<T>(&self.srcs, output.as_mut_ptr(), shard, op) };
        self.world.sync();
        drop(guard);
        Ok(())
    }

    /// The reduce phase of `all_reduce` alone: rank r's shard of every buffer, reduced into
    /// its own buffer's shard.
    fn reduce_scatter_in_place_t<T: Elem>(&mut self, buf: &mut [T], call: Call) -> Result<()> {
        let op = call.op.expect("reduce_scatter has an op");
        let ptr = buf.as_mut_ptr();
        let shard = buf.len() / self.world.n_ranks;
        self.arrive(call, ptr as usize)?;
        let guard = AbortOnPanic::new();
        let offset_bytes = self.rank * shard * std::mem::size_of::<T>();
        self.srcs.clear();
        self.srcs
            .extend(self.posts.iter().map(|p| p.src + offset_bytes));
        // SAFETY: every buffer has world × shard elements (checked at arrival); only this rank
        // touches shard `rank` of any buffer, and only its own buffer is written.
        unsafe { reduce_into::<T>(&self.srcs, ptr.add(self.rank * shard), shard, op) };
        self.world.sync();
        drop(guard);
        Ok(())
    }

    /// Posts the address of this rank's own shard, so in-place and out-of-place all-gathers
    /// look the same to the other ranks.
    fn all_gather_in_place_t<T: Elem>(&mut self, buf: &mut [T], call: Call) -> Result<()> {
        let ptr = buf.as_mut_ptr();
        let shard = buf.len() / self.world.n_ranks;
        // SAFETY: rank < n_ranks, so the offset is within `buf`.
        let own = unsafe { ptr.add(self.rank * shard) };
        self.arrive(call, own as usize)?;
        let guard = AbortOnPanic::new();
        for (k, post) in self
            .posts
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != self.rank)
        {
            // SAFETY: each posted shard has `shard` elements and is only read during the
            // collective; this rank writes only its own buffer outside its own shard, which
            // nobody reads.
            unsafe {
                std::ptr::copy_nonoverlapping(post.src as *const T, ptr.add(k * shard), shard)
            };
        }
        self.world.sync();
        drop(guard);
        Ok(())
    }

    fn all_gather_t<T: Elem>(&mut self, input: &[T], output: &mut [T], call: Call) -> Result<()> {
        self.arrive(call, input.as_ptr() as usize)?;
        let guard = AbortOnPanic::new();
        let shard = input.len();
        for (k, post) in self.posts.iter().enumerate() {
            // SAFETY: inputs are read-only during the collective and have `shard` elements;
            // `output` is this rank's own.
            let src = unsafe { std::slice::from_raw_parts(post.src as *const T, shard) };
            output[k * shard..(k + 1) * shard].copy_from_slice(src);
        }
        self.world.sync();
        drop(guard);
        Ok(())
    }

    fn broadcast_t<T: Elem>(&mut self, buf: &mut [T], call: Call) -> Result<()> {
        let root = call.root.expect("broadcast has a root");
        let ptr = buf.as_mut_ptr();
        self.arrive(call, ptr as usize)?;
        let guard = AbortOnPanic::new();
        if self.rank != root {
            // SAFETY: the root's buffer is read-only during the collective and has the same
            // length (checked at arrival); this rank's buffer is read by nobody.
            unsafe {
                std::ptr::copy_nonoverlapping(self.posts[root].src as *const T, ptr, buf.len())
            };
        }
        self.world.sync();
        drop(guard);
        Ok(())
    }
}

impl Collective for InProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world.n_ranks
    }

    fn all_reduce(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let mut call = self.call(CollectiveKind::AllReduce, buf.dtype(), buf.len(), buf.len());
        call.op = Some(op);
        match buf {
            BufMut::F32(b) => self.all_reduce_t(b, call)?,
            BufMut::Bf16(b) => self.all_reduce_t(b, call)?,
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, op: ReduceOp) -> Result<()> {
        const OP: &str = "reduce_scatter";
        let n = self.world.n_ranks;
        if input.len() != n * output.len() {
            return Err(self.bad_args(
                OP,
                format!(
                "input has {} elements but must be world_size ({n}) × output ({} elements) = {}",
                input.len(), output.len(), n * output.len()
            ),
            ));
        }
        let mut call = self.call(
            CollectiveKind::ReduceScatter,
            input.dtype(),
            input.len(),
            output.len(),
        );
        call.op = Some(op);
        match (input, output) {
            (Buf::F32(i), BufMut::F32(o)) => self.reduce_scatter_t(i, o, call)?,
            (Buf::Bf16(i), BufMut::Bf16(o)) => self.reduce_scatter_t(i, o, call)?,
            (i, o) => return Err(self.mixed_dtypes(OP, i.dtype(), o.dtype())),
        }
        Ok(())
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        const OP: &str = "all_gather";
        let n = self.world.n_ranks;
        if output.len() != n * input.len() {
            return Err(self.bad_args(
                OP,
                format!(
                "output has {} elements but must be world_size ({n}) × input ({} elements) = {}",
                output.len(), input.len(), n * input.len()
            ),
            ));
        }
        let call = self.call(
            CollectiveKind::AllGather,
            input.dtype(),
            input.len(),
            output.len(),
        );
        match (input, output) {
            (Buf::F32(i), BufMut::F32(o)) => self.all_gather_t(i, o, call)?,
            (Buf::Bf16(i), BufMut::Bf16(o)) => self.all_gather_t(i, o, call)?,
            (i, o) => return Err(self.mixed_dtypes(OP, i.dtype(), o.dtype())),
        }
        Ok(())
    }

    fn reduce_scatter_in_place(&mut self, buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        const OP: &str = "reduce_scatter_in_place";
        let n = self.world.n_ranks;
        self.check_divisible(OP, buf.len())?;
        let mut call = self.call(
            CollectiveKind::ReduceScatter,
            buf.dtype(),
            buf.len(),
            buf.len() / n,
        );
        call.op = Some(op);
        match buf {
            BufMut::F32(b) => self.reduce_scatter_in_place_t(b, call)?,
            BufMut::Bf16(b) => self.reduce_scatter_in_place_t(b, call)?,
        }
        Ok(())
    }

    fn all_gather_in_place(&mut self, buf: BufMut<'_>) -> Result<()> {
        const OP: &str = "all_gather_in_place";
        let n = self.world.n_ranks;
        self.check_divisible(OP, buf.len())?;
        let call = self.call(
            CollectiveKind::AllGather,
            buf.dtype(),
            buf.len() / n,
            buf.len(),
        );
        match buf {
            BufMut::F32(b) => self.all_gather_in_place_t(b, call)?,
            BufMut::Bf16(b) => self.all_gather_in_place_t(b, call)?,
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: BufMut<'_>, root: usize) -> Result<()> {
        let n = self.world.n_ranks;
        if root >= n {
            return Err(self.bad_args(
                "broadcast",
                format!("root {root} is not a rank of this world of {n} (ranks are 0..{n})"),
            ));
        }
        let mut call = self.call(CollectiveKind::Broadcast, buf.dtype(), buf.len(), buf.len());
        call.root = Some(root);
        match buf {
            BufMut::F32(b) => self.broadcast_t(b, call)?,
            BufMut::Bf16(b) => self.broadcast_t(b, call)?,
        }
        Ok(())
    }

    fn send_bytes(&mut self, bytes: &[u8], dest: usize) -> Result<()> {
        if dest >= self.world.n_ranks || dest == self.rank {
            let detail = format!("rank {dest} of {} (not this rank)", self.world.n_ranks);
            return Err(self.bad_args("send", detail));
        }
        self.world.post(self.rank, dest, bytes.to_vec())
    }

    fn recv_bytes(&mut self, out: &mut [u8], src: usize) -> Result<()> {
        if src >= self.world.n_ranks || src == self.rank {
            let detail = format!("rank {src} of {} (not this rank)", self.world.n_ranks);
            return Err(self.bad_args("recv", detail));
        }
        let m = self.world.take(src, self.rank)?;
        if m.len() != out.len() {
            let detail = format!(
                "{} bytes sent by rank {src}, {} expected",
                m.len(),
                out.len()
            );
            return Err(self.bad_args("recv", detail));
        }
        out.copy_from_slice(&m);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let call = self.call(CollectiveKind::Barrier, DType::F32, 0, 0);
        self.arrive(call, 0)?;
        Ok(())
    }

    fn abort(&self, reason: &str) {
        self.world.fail(CommError::Aborted {
            rank: self.rank,
            reason: reason.to_string(),
        });
    }

    fn split(&mut self, color: u32, key: u32) -> Result<Box<dyn Collective>> {
        let ask = [color, key];
        let call = self.call(CollectiveKind::Split, DType::F32, 0, 0);
        let idx = call.idx;
        self.arrive(call, ask.as_ptr() as usize)?;
        let guard = AbortOnPanic::new();
        let mut members: Vec<(u32, usize)> = Vec::new();
        for (r, post) in self.posts.iter().enumerate() {
            // SAFETY: every rank posted the address of its own `[u32; 2]`, which lives until
            // its final `sync` below; nobody writes it.
            let [c, k] = unsafe { *(post.src as *const [u32; 2]) };
            if c == color {
                members.push((k, r));
            }
        }
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .expect("a rank is in its own group");
        let group = self.world.group(idx, color, members.len());
        self.world.sync();
        self.world.forget_group(idx, color);
        drop(guard);
        Ok(Box::new(InProcessComm::new(group, new_rank)))
    }
}

impl InProcessComm {
    fn check_divisible(&self, op: &'static str, len: usize) -> Result<()> {
        let n = self.world.n_ranks;
        if len % n == 0 {
            return Ok(());
        }
        Err(self.bad_args(
            op,
            format!(
                "buffer has {len} elements, not a multiple of world_size ({n}); pad it to {}",
                len.div_ceil(n) * n
            ),
        ))
    }

    fn mixed_dtypes(&self, op: &'static str, input: DType, output: DType) -> CommError {
        self.bad_args(
            op,
            format!(
                "input is {} but output is {}; both must have the same element type",
                input.name(),
                output.name()
            ),
        )
    }
}

impl Drop for InProcessComm {
    /// A rank that goes away (its thread panicked, or it returned early) can never join another
    /// collective: fail the world so the other ranks get an error naming it instead of waiting.
    fn drop(&mut self) {
        self.world.fail(CommError::RankGone {
            rank: self.rank,
            panicked: std::thread::panicking(),
        });
    }
}
