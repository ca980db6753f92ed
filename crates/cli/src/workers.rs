//! The threads a command computes on. A command's driving thread runs on a worker of a rayon
//! pool with one thread a core, so every parallel loop it starts shares out over the pool with
//! the driver taking its part. A driver outside the pool (rayon's global pool, started beside
//! it) waits on each loop, one thread more than there are cores, and wakes the workers for
//! every loop: on SmolLM2 (2 cores) that cost 2.5 ms of a 11 ms decode step and 9 ms of a
//! short prompt's prefill.

use anyhow::Context;

/// Workers named `name N` with the main thread's stack size (a command runs on one of them).
fn builder(name: &'static str) -> rayon::ThreadPoolBuilder {
    rayon::ThreadPoolBuilder::new()
        .thread_name(move |i| format!("{name} {i}"))
        .stack_size(8 << 20)
}

/// A pool of `threads` workers.
pub fn pool(threads: usize, name: &'static str) -> anyhow::Result<rayon::ThreadPool> {
    builder(name)
        .num_threads(threads)
        .build()
        .context("starting a thread pool")
}

/// A pool of one worker a core (`RAYON_NUM_THREADS` when set, as rayon's own).
pub fn machine(name: &'static str) -> anyhow::Result<rayon::ThreadPool> {
    builder(name).build().context("starting a thread pool")
}

/// Runs `f` on a worker of a pool of this machine's threads.
pub fn install<T: Send>(f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    machine("compute")?.install(f)
}
