//! PyTorch's CUDA caching allocator, replayed over a tape's events to predict the reserve
//! (`torch.cuda.max_memory_reserved`).
//!
//! Rules from `c10/cuda/CUDACachingAllocator.cpp` (defaults, no `PYTORCH_CUDA_ALLOC_CONF`):
//! requests of at most 1 MiB come from the small pool in 2 MiB segments, larger ones from the
//! large pool, in 20 MiB segments below 10 MiB and otherwise in segments of the request rounded
//! up to 2 MiB; a free block is found best-fit (smallest that fits, then lowest address) and split
//! when the rest is at least 512 B (small pool) or more than 1 MiB (large pool); freed blocks merge
//! with free neighbours; segments are kept (no `empty_cache`). One stream. Example:
//! `Allocator::default().replay(&tape)` returns the reserved bytes.

use super::tape::{Event, Tape};
use std::collections::{BTreeSet, HashMap};

const MIB: u64 = 1 << 20;
const SMALL_SIZE: u64 = MIB;
const SMALL_BUFFER: u64 = 2 * MIB;
const LARGE_BUFFER: u64 = 20 * MIB;
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
const ROUND_LARGE: u64 = 2 * MIB;

#[derive(Clone, Copy, Debug)]
struct Block {
    segment: usize,
    offset: u64,
    size: u64,
    free: bool,
}

/// A replay of the caching allocator's segments and blocks.
#[derive(Default)]
pub struct Allocator {
    blocks: Vec<Block>,
    /// Per segment, its blocks' ids ordered by offset.
    segments: Vec<(bool, Vec<usize>)>,
    /// Free blocks per pool (small = true) as (size, segment, offset, block id).
    free: [BTreeSet<(u64, usize, u64, usize)>; 2],
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
}

fn segment_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Where a training tape's events sit: the optimizer state's allocations, the first event of the
/// step (forward onwards) and the first of its optimizer phase.
#[derive(Clone, Debug)]
pub struct StepOrder {
    pub states: std::ops::Range<usize>,
    pub step_from: usize,
    pub optimizer_at: usize,
    /// The state is created inside the first step's `optimizer.step()` (torch optimizers), not
    /// before the first step (DeepSpeed).
    pub lazy_states: bool,
}

/// Steps a calibration run takes before its last (the reserve is the run's high-water mark).
pub const RUN_STEPS: usize = 3;

impl Allocator {
    /// Replays every allocation and free of `tape`; returns the peak reserved bytes.
    pub fn replay(&mut self, tape: &Tape) -> u64 {
        self.replay_events(tape, tape.events.iter())
    }

    /// Replays a run of [`RUN_STEPS`] training steps from one steady step's tape: the build,
    /// then the first step with a torch optimizer's state born in its `step()` (after backward
    /// freed the activations, so it lands in their cached blocks), then the steady steps. The
    /// reserve never shrinks, so the first step's layout is part of what `nvidia-smi` shows.
    pub fn replay_run(&mut self, tape: &Tape, o: &StepOrder) -> u64 {
        let e = &tape.events;
        if !o.lazy_states {
            let steps = (1..RUN_STEPS).flat_map(|_| e[o.step_from..].iter());
            return self.replay_events(tape, e.iter().chain(steps));
        }
        let build = e[..o.states.start]
            .iter()
            .chain(&e[o.states.end..o.step_from]);
        let first = e[o.step_from..o.optimizer_at]
            .iter()
            .chain(&e[o.states.clone()])
            .chain(&e[o.optimizer_at..]);
        let steady = (1..RUN_STEPS).flat_map(|_| e[o.step_from..].iter());
        self.replay_events(tape, build.chain(first).chain(steady))
    }

    fn replay_events<'a>(&mut self, tape: &Tape, events: impl Iterator<Item = &'a Event>) -> u64 {
        let mut where_: HashMap<usize, usize> = HashMap::new();
        for e in events {
            match *e {
                Event::Alloc(t) => {
                    let b = self.malloc(tape.tensors[t].bytes);
                    // A tensor the previous step never freed stays allocated (a leak repeats).
                    where_.insert(t, b);
                }
                Event::Free(t) => {
                    if let Some(b) = where_.remove(&t) {
                        self.release(b);
                    }
                }
                Event::Phase(_) => {}
            }
        }
        self.peak_reserved_bytes
    }

    /// Allocates `size` bytes (already a multiple of 512); returns the block id.
    pub fn malloc(&mut self, size: u64) -> usize {
        let small = size <= SMALL_SIZE;
        let pool = usize::from(small);
        let found = self.free[pool].range((size, 0, 0, 0)..).next().copied();
        let id = match found {
            Some(key) => {
                self.free[pool].remove(&key);
                key.3
            }
            None => self.new_segment(segment_size(size), small),
        };
        self.blocks[id].free = false;
        let rest = self.blocks[id].size - size;
        let split = if small {
            rest >= 512
        } else {
            rest > SMALL_SIZE
        };
        if split {
            let b = self.blocks[id];
            self.blocks[id].size = size;
            let new_id = self.blocks.len();
            self.blocks.push(Block {
                segment: b.segment,
                offset: b.offset + size,
                size: rest,
                free: true,
            });
            let list = &mut self.segments[b.segment].1;
            let pos = list.iter().position(|&x| x == id).unwrap_or(0);
            list.insert(pos + 1, new_id);
            self.free[pool].insert((rest, b.segment, b.offset + size, new_id));
        }
        id
    }

    fn new_segment(&mut self, size: u64, small: bool) -> usize {
        let segment = self.segments.len();
        let id = self.blocks.len();
        self.blocks.push(Block {
            segment,
            offset: 0,
            size,
            free: true,
        });
        self.segments.push((small, vec![id]));
        self.reserved_bytes += size;
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
        id
    }

    /// Frees block `id`, merging it with free neighbours in its segment.
    pub fn release(&mut self, id: usize) {
        let seg = self.blocks[id].segment;
        let pool = usize::from(self.segments[seg].0);
        self.blocks[id].free = true;
        let mut list = std::mem::take(&mut self.segments[seg].1);
        let mut pos = list.iter().position(|&x| x == id).unwrap_or(0);
        // Merge with the next block, then with the previous one.
        if pos + 1 < list.len() && self.blocks[list[pos + 1]].free {
            let next = list.remove(pos + 1);
            let nb = self.blocks[next];
            self.free[pool].remove(&(nb.size, seg, nb.offset, next));
            self.blocks[id].size += nb.size;
        }
        if pos > 0 && self.blocks[list[pos - 1]].free {
            let prev = list[pos - 1];
            let pb = self.blocks[prev];
            self.free[pool].remove(&(pb.size, seg, pb.offset, prev));
            self.blocks[prev].size += self.blocks[id].size;
            list.remove(pos);
            pos -= 1;
        }
        let keep = list[pos];
        let kb = self.blocks[keep];
        self.free[pool].insert((kb.size, seg, kb.offset, keep));
        self.segments[seg].1 = list;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_follow_the_size_classes() {
        let mut a = Allocator::default();
        let x = a.malloc(512); // small pool: one 2 MiB segment
        let y = a.malloc(2 * MIB); // 1-10 MiB: a 20 MiB segment
        let z = a.malloc(2 * MIB); // fits in the rest of that segment
        assert_eq!(a.reserved_bytes, 22 * MIB);
        a.malloc(33 * MIB); // >= 10 MiB: rounded to 2 MiB
        assert_eq!(a.reserved_bytes, 56 * MIB);
        a.release(y);
        a.release(z);
        a.release(x);
        let w = a.malloc(18 * MIB); // reuses the merged 20 MiB segment
        assert_eq!(a.reserved_bytes, 56 * MIB);
        a.release(w);
    }
}
