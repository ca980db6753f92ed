//! Prefill/decode disaggregation over MPI processes: `mpirun -n P+1 frugal serve --comm mpi
//! --prefill-ranks P`. Rank 0 answers HTTP and decodes; ranks 1..=P each load the model and run
//! prompts. For each prefill rank, rank 0 keeps a proxy thread on a two-rank communicator of
//! their own: it takes the next admitted prompt from the engine's queue, sends it (tokens,
//! sampling, seed), waits for the first token and the sampler's state, then takes the prompt's
//! KV off the wire and hands both to the engine, which imports the KV and only decodes. The
//! engine's loop is the one threads use (`pd`); here the KV arrives with the answer.
//!
//! A prefill rank waits for work without a deadline and without holding a core
//! (`comm::Mpi::wait_bytes`); an empty message ends it. A rank that fails to start ends the job
//! (`MPI_Abort`) with its reason, so no rank waits on one that is gone. A rank killed under
//! `mpiexec` ends the job too: MPICH's launcher stops every process when one dies.

use super::mpi_job::{check_threads, ready, settle, signal_ready, End};
use super::Args;
use anyhow::{bail, Context};
use comm::Collective;
use infer::group::Group;
use infer::sample::Sampling;
use models::Loaded;
use plan_frugal::ServeSetup;
use server::engine::Job;
use server::pd::{prefill_export, Disaggregated, PrefillJob, Prefilled, Replies, Shipped};
use std::sync::{mpsc, Arc, Mutex};

/// What rank 0 serves with, and what ends the job after the server stops.
pub struct Rank0 {
    pub worker: Group,
    pub pd: Disaggregated,
    pub end: End,
}

/// This process's part: `None` on a prefill rank (its loop ran until rank 0 stopped it), the
/// decode worker and its proxies on rank 0.
pub fn start(args: &Args, source: Loaded, setup: ServeSetup) -> anyhow::Result<Option<Rank0>> {
    let timeout = engine::world::DEFAULT_TIMEOUT;
    let mut world = comm::Mpi::init(timeout, |why| eprintln!("error: {why}"))?;
    let (rank, size) = (world.rank(), world.world_size());
    type Lead = (Group, Disaggregated, Vec<std::thread::JoinHandle<()>>);
    let result = (|| -> anyhow::Result<Option<Lead>> {
        check_threads(size)?;
        if size != args.prefill_ranks + 1 {
            bail!(
                "--comm mpi --prefill-ranks {}: run {} processes (mpirun -n {}), rank 0 to \
                 answer and decode, one per prefill rank",
                args.prefill_ranks,
                args.prefill_ranks + 1,
                args.prefill_ranks + 1
            );
        }
        // Rank 0 and each prefill rank on a communicator of their own (a split every rank
        // joins, once per prefill rank).
        let (mut links, mut mine) = (Vec::new(), None);
        for r in 1..size {
            let member = rank == 0 || rank == r;
            let link = world.split_mpi(u32::from(!member), rank as u32)?;
            match (member, rank) {
                (true, 0) => links.push((r, link)),
                (true, _) => mine = Some(link),
                (false, _) => {}
            }
        }
        let prefill_setup = ServeSetup {
            max_seqs: 1,
            kv_blocks: setup.context.div_ceil(setup.kv_block),
            ..setup
        };
        if let Some(mut link) = mine {
            let worker = source.worker(prefill_setup)?;
            signal_ready(&mut link)?;
            serve_prefills(link, worker)?;
            return Ok(None);
        }
        let decode_setup = ServeSetup {
            prefill_chunk: 1,
            ..setup
        };
        let worker = Group::single(source.worker(decode_setup)?);
        for (r, link) in &mut links {
            ready(link, 1).with_context(|| format!("prefill rank {r}"))?;
        }
        eprintln!(
            "frugal serve: {} prefill ranks (MPI processes, each planned {} bytes), decode on \
             rank 0 (planned {} bytes)",
            args.prefill_ranks,
            plan_frugal::serve_plan(&source.config.shape, &prefill_setup)?
                .peak_bytes(plan::buffer::Device::Gpu),
            worker.plan.peak_bytes(plan::buffer::Device::Gpu)
        );
        let (jobs_tx, jobs_rx) = mpsc::channel::<PrefillJob>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let (done_tx, done_rx) = mpsc::channel();
        // Only the proxies answer: when every one has gone, the engine hears it.
        let replies: Replies = Arc::new(vec![done_tx]);
        let mut proxies = Vec::new();
        for (r, link) in links {
            let (jobs, replies) = (jobs_rx.clone(), replies.clone());
            let thread = std::thread::Builder::new()
                .name(format!("prefill rank {r} proxy"))
                .spawn(move || proxy(link, r, &jobs, &replies))
                .context("starting a proxy thread")?;
            proxies.push(thread);
        }
        drop(replies);
        let pd = Disaggregated {
            jobs: jobs_tx,
            done: done_rx,
            rank: 0,
            comm: None,
            in_flight: 0,
            in_flight_blocks: 0,
        };
        Ok(Some((worker, pd, proxies)))
    })();
    settle(result, world, rank, size, |(worker, pd, proxies), world| {
        Rank0 {
            worker,
            pd,
            end: End {
                proxies,
                world: Some(world),
            },
        }
    })
}

/// A prompt's message: its length, the sampler (top-k + 1 or 0, the temperature's bits, the
/// vocabulary limit + 1 or 0), the sampler's seed, top-p's bits, then the tokens.
fn job_message(job: &Job) -> Vec<u8> {
    let s = &job.sampling;
    let head = [
        job.prompt.len() as u64,
        s.top_k.map_or(0, |k| k as u64 + 1),
        u64::from(s.temperature.to_bits()),
        s.vocab_limit.map_or(0, |v| v as u64 + 1),
        job.seed,
        u64::from(s.top_p.to_bits()),
    ];
    let mut msg: Vec<u8> = head.iter().flat_map(|w| w.to_le_bytes()).collect();
    msg.extend(job.prompt.iter().flat_map(|t| t.to_le_bytes()));
    msg
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// A job message's head: six words before the tokens.
const HEAD: usize = 48;

/// The prompt, sampler and seed of a job message; `None` for a malformed one.
fn parse_job(msg: &[u8]) -> Option<(Vec<u32>, Sampling, u64)> {
    let head: Vec<u64> = words(msg.get(..HEAD)?).collect();
    let len = usize::try_from(head[0]).ok()?;
    let end = len.checked_mul(4)?.checked_add(HEAD)?;
    if msg.len() != end {
        return None;
    }
    let tokens = &msg[HEAD..end];
    let opt = |w: u64| w.checked_sub(1).map(|v| v as usize);
    let sampling = Sampling {
        top_k: opt(head[1]),
        temperature: f32::from_bits(head[2] as u32),
        top_p: f32::from_bits(head[5] as u32),
        vocab_limit: opt(head[3]),
    };
    let prompt = tokens
        .chunks_exact(4)
        .map(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")))
        .collect();
    Some((prompt, sampling, head[4]))
}

/// Rank 0's side of one prefill rank: sends it each prompt the engine admits and hands back
/// the first token, the sampler's state and the KV; an empty message stops the rank when the
/// engine has gone.
fn proxy(
    mut link: comm::Mpi,
    rank: usize,
    jobs: &Mutex<mpsc::Receiver<PrefillJob>>,
    replies: &Replies,
) {
    loop {
        let next = jobs.lock().ok().and_then(|j| j.recv().ok());
        let Some(PrefillJob { job, blocks, to }) = next else {
            let _ = link.send_bytes(&[], 1);
            return;
        };
        let outcome = exchange(&mut link, rank, &job)
            .map_err(|e| format!("prefill rank {rank}: {e}"))
            .and_then(|r| r);
        if replies[to]
            .send(Prefilled {
                job,
                blocks,
                outcome,
            })
            .is_err()
        {
            let _ = link.send_bytes(&[], 1);
            return;
        }
    }
}

/// One prompt there and its answer back: `Err` when the link failed, `Ok(Err)` when the rank
/// could not run the prompt.
fn exchange(link: &mut comm::Mpi, rank: usize, job: &Job) -> comm::Result<Result<Shipped, String>> {
    link.send_bytes(&job_message(job), 1)?;
    let (mut head, mut body) = (Vec::new(), Vec::new());
    link.wait_bytes(&mut head, 1)?;
    let prefilled_at = std::time::Instant::now();
    link.wait_bytes(&mut body, 1)?;
    let h: Vec<u64> = words(&head).collect();
    if h.len() != 4 || h[0] != 1 {
        return Ok(Err(format!(
            "prefill rank {rank}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    Ok(Ok(Shipped {
        first: h[1] as u32,
        rng: data::SplitMix64::new(h[2]),
        tokens: h[3] as usize,
        from: rank,
        bytes: body.len(),
        kv: Some(body),
        prefilled_at,
    }))
}

/// A prefill rank's loop: each prompt prefilled, its first token sampled and its KV sent to
/// rank 0, the sequence freed; an empty message ends it.
fn serve_prefills(mut link: comm::Mpi, mut worker: infer::Worker) -> anyhow::Result<()> {
    let (mut msg, mut logits, mut kv) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        link.wait_bytes(&mut msg, 0)?;
        if msg.is_empty() {
            return Ok(());
        }
        let outcome = (|| -> Result<[u64; 3], String> {
            let (prompt, sampling, seed) = parse_job(&msg).ok_or("a malformed prompt message")?;
            let (first, rng) =
                prefill_export(&mut worker, &prompt, &sampling, seed, &mut logits, &mut kv)?;
            Ok([u64::from(first), rng.state(), prompt.len() as u64])
        })();
        let (head, body): ([u64; 4], &[u8]) = match &outcome {
            Ok([first, state, len]) => ([1, *first, *state, *len], &kv),
            Err(e) => ([0; 4], e.as_bytes()),
        };
        let head: Vec<u8> = head.iter().flat_map(|w| w.to_le_bytes()).collect();
        link.send_bytes(&head, 0)?;
        link.send_bytes(body, 0)?;
    }
}
