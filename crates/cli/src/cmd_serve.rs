//! `frugal serve`: a model behind the OpenAI API (the `server` crate), on this process's cores,
//! split over tensor-parallel ranks (`--tp`), with prompts prefilled by ranks of their own
//! (`--prefill-ranks`), or over MPI processes (`--comm mpi`).
//!
//! Example: `frugal serve --model SmolLM2-135M-Instruct.Q4_1.gguf`, then
//! `curl localhost:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'`.

#[cfg(feature = "mpi")]
mod mpi_job;
#[cfg(feature = "mpi")]
mod pd_mpi;
#[cfg(feature = "mpi")]
mod tp_mpi;
/// Without the feature no MPI job starts, so none ends.
#[cfg(not(feature = "mpi"))]
mod mpi_job {
    pub enum End {}
    impl End {
        pub fn finish(self) {
            match self {}
        }
    }
}

use anyhow::{anyhow, bail, Context};
use models::ModelSource;
use plan_frugal::ServeSetup;
use server::{engine, metrics, openai, pd, State};
use std::path::PathBuf;
use std::sync::Arc;

const EXAMPLES: &str = "\
Examples:
  frugal serve --model SmolLM2-135M-Instruct.Q4_1.gguf
  frugal serve --model run1 --port 8001 --weights int8 --ctx 1024
  frugal serve --model SmolLM2-135M-Instruct.Q4_1.gguf --tp 3
  mpirun -n 3 frugal serve --comm mpi --model SmolLM2-135M-Instruct.Q4_1.gguf
  mpirun -n 3 frugal serve --comm mpi --prefill-ranks 2 --model SmolLM2-135M-Instruct.Q4_1.gguf
  curl localhost:8000/v1/completions -d '{\"prompt\": \"ROMEO:\", \"max_tokens\": 32}'
  curl localhost:8000/v1/chat/completions -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}'";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The model (any --model of generate: a GGUF file, an HF folder, a training --out, ...).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    #[command(flatten)]
    pub storage: crate::cmd_generate::Storage,
    /// Tokens of context a request may use, prompt and answer together (default: the model's,
    /// at most 4096).
    #[arg(long)]
    pub ctx: Option<u64>,
    /// Requests that may wait for the engine; one more is answered 429 (besides these, each
    /// decode worker may hold one it took but has no room for yet).
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Requests decoded together in one batch (continuous batching: one joins as another ends).
    #[arg(long, default_value_t = 4)]
    pub max_seqs: u64,
    /// Tokens the paged KV pool holds over all requests (default: --max-seqs x --ctx); a request
    /// waits until its prompt and max_tokens fit.
    #[arg(long)]
    pub kv_tokens: Option<u64>,
    /// Tensor-parallel ranks (threads of this process; with --comm mpi, the launcher's
    /// processes), as generate's --tp: each holds its share of the heads, the MLP and the
    /// vocabulary, and the batch runs on all of them.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Prefill/decode disaggregation: this many prefill workers (ranks of their own) run the
    /// prompts and ship their KV to the decode worker, which only decodes, so long prompts stop
    /// stalling the tokens of running requests. 0: one worker does both.
    #[arg(long, default_value_t = 0)]
    pub prefill_ranks: usize,
    /// With --prefill-ranks: the cores the prefill workers share (default half the machine's);
    /// the decode workers get the rest.
    #[arg(long)]
    pub prefill_threads: Option<usize>,
    /// Decode workers (engines), each with its own copy of the weights and its own KV pool and
    /// batch, sharing the request queue (an engine takes a request when it has room, as vLLM's
    /// data-parallel engines): with --prefill-ranks, the prefill workers ship each prompt's KV
    /// to the engine that admitted it. Threads of this process; the cores are shared out.
    #[arg(long, default_value_t = 1)]
    pub decode_ranks: usize,
    /// threads (ranks in this process) or mpi (one rank per process; a frugal built with
    /// `--features mpi`): `mpirun -n N` splits the model over N tensor-parallel processes;
    /// with --prefill-ranks P, `mpirun -n P+1` has rank 0 answer and decode and the others
    /// prefill.
    #[arg(long, default_value = "threads")]
    pub comm: comm::Transport,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.tp == 0 {
        bail!("--tp 0: give at least one tensor-parallel rank (1: the whole model on one)");
    }
    if args.queue == 0 {
        bail!("--queue 0: at least one request must be able to wait");
    }
    if !(1..=64).contains(&args.decode_ranks) {
        bail!(
            "--decode-ranks {}: give 1 to 64 decode workers",
            args.decode_ranks
        );
    }
    let model = ModelSource::at(&args.model)?;
    let tok = model.tokenizer()?;
    let source = model.load()?;
    let shape = &source.config.shape;
    let ctx = args.ctx.unwrap_or(shape.max_positions.min(4096));
    if ctx < 2 || ctx > shape.max_positions {
        bail!(
            "--ctx {ctx}: give 2 to the model's context of {} tokens",
            shape.max_positions
        );
    }
    let (weights, kv) = args.storage.formats(&source)?;
    // ggml in the file's own group and 4-bit matrices, for every role's plan.
    let weights = source.narrow(weights)?;
    if !(1..=256).contains(&args.max_seqs) {
        bail!(
            "--max-seqs {}: give 1 to 256 requests per batch",
            args.max_seqs
        );
    }
    let mut setup = ServeSetup::generation(
        shape,
        args.max_seqs,
        ctx,
        weights,
        kv,
        16,
        infer::default_split_k(),
    );
    if let Some(tokens) = args.kv_tokens {
        if tokens < ctx {
            bail!("--kv-tokens {tokens}: the pool must hold at least one request of --ctx {ctx} tokens");
        }
        setup.kv_blocks = tokens.div_ceil(setup.kv_block);
    }
    if args.prefill_threads.is_some() && args.prefill_ranks == 0 {
        bail!("--prefill-threads sizes the prefill workers of --prefill-ranks: give both");
    }
    let decode = args.decode_ranks;
    let mut end = None;
    let engines: Vec<Engine> = match (args.tp, args.prefill_ranks) {
        _ if args.comm == comm::Transport::Mpi => {
            let Some((worker, pd, e)) = over_mpi(&args, source, setup)? else {
                // A rank other than 0: rank 0 has stopped it.
                return Ok(());
            };
            end = Some(e);
            vec![(worker, pd, crate::workers::machine("engine")?)]
        }
        (1, 0) => replicas(&args, &source, setup)?,
        (tp, 0) if decode == 1 => vec![(
            models::tp::group(&args.model, source, setup, tp)?,
            None,
            crate::workers::machine("engine")?,
        )],
        (1, _) => disaggregate(&args, source, setup)?,
        _ => bail!(
            "--tp with --prefill-ranks or --decode-ranks: a tensor-parallel group is one decode \
             worker fed by no prefill ranks; use one of the two"
        ),
    };
    let (jobs, queue) = std::sync::mpsc::sync_channel(args.queue);
    let queue = server::queue::Queue::new(queue);
    let metrics = Arc::new(metrics::Metrics::default());
    // Each engine drives its pool from one of the pool's workers (see `workers`).
    let mut threads = Vec::new();
    for (i, (worker, pd, pool)) in engines.into_iter().enumerate() {
        let (tok, queue, metrics) = (tok.clone(), queue.clone(), metrics.clone());
        let thread = std::thread::Builder::new()
            .name(format!("engine {i}"))
            .spawn(move || pool.install(|| engine::run(worker, tok, queue, (metrics, i), pd)))
            .context("starting an engine thread")?;
        threads.push(thread);
    }
    queue.until_idle(threads.len(), || threads.iter().any(|t| t.is_finished()));
    drop(queue);
    let state = Arc::new(State {
        name: args.model.display().to_string(),
        tok,
        ctx: ctx as usize,
        jobs,
        metrics,
        logprobs: args.prefill_ranks == 0,
    });
    let addr = format!("{}:{}", args.host, args.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the server");
    // No early return from here: with --comm mpi the engine and the other ranks end below.
    let served = runtime.and_then(|rt| {
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|e| anyhow!("invalid --port/--host: cannot listen on {addr}: {e}"))?;
            let bound = listener.local_addr().context("the server's address")?;
            println!(
                "frugal serve: {} on http://{bound}/v1 (Ctrl-C to stop)",
                state.name
            );
            use std::io::Write;
            std::io::stdout().flush().ok();
            axum::serve(listener, openai::router(state))
                .with_graceful_shutdown(stop_signal())
                .await
                .context("serving")?;
            // stdout may be closed by now (a supervisor that read the first line and left).
            let _ = writeln!(
                std::io::stdout(),
                "frugal serve: stopped, every admitted request answered"
            );
            Ok(())
        })
    });
    if let Some(end) = end {
        // The engine stops once the server's handlers are gone; then the other ranks, and MPI.
        for thread in threads {
            let _ = thread.join();
        }
        end.finish();
    }
    served
}

/// A decode worker, its prefill workers' side (with --prefill-ranks), and its cores.
type Engine = (
    infer::group::Group,
    Option<pd::Disaggregated>,
    rayon::ThreadPool,
);

/// `--decode-ranks D` without prefill ranks: D workers of the whole model, each on its share of
/// the cores (one worker: all of them).
fn replicas(
    args: &Args,
    source: &models::Loaded,
    setup: ServeSetup,
) -> anyhow::Result<Vec<Engine>> {
    if args.decode_ranks == 1 {
        let worker = infer::group::Group::single(source.worker(setup)?);
        return Ok(vec![(worker, None, crate::workers::machine("engine")?)]);
    }
    fits_together(&[(args.decode_ranks, &source.config.shape, &setup)])?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / args.decode_ranks).max(1);
    let engines = (0..args.decode_ranks).map(|_| {
        let worker = infer::group::Group::single(source.worker(setup)?);
        Ok((worker, None, crate::workers::pool(threads, "engine")?))
    });
    let engines = engines.collect::<anyhow::Result<Vec<Engine>>>()?;
    eprintln!(
        "frugal serve: {} decode workers on {threads} threads each (each planned {} bytes)",
        args.decode_ranks,
        engines[0].0.plan.peak_bytes(plan::buffer::Device::Gpu)
    );
    Ok(engines)
}

/// `--comm mpi`: this process's part of an MPI job (see `pd_mpi`); `None` on a prefill rank.
#[cfg(feature = "mpi")]
fn over_mpi(
    args: &Args,
    source: models::Loaded,
    setup: ServeSetup,
) -> anyhow::Result<Option<(infer::group::Group, Option<pd::Disaggregated>, mpi_job::End)>> {
    check_mpi(args)?;
    if args.prefill_ranks == 0 {
        return Ok(tp_mpi::start(args, source, setup)?.map(|(group, end)| (group, None, end)));
    }
    Ok(pd_mpi::start(args, source, setup)?.map(|r| (r.worker, Some(r.pd), r.end)))
}

/// Without the feature: the flag is known, the backend is not built in.
#[cfg(not(feature = "mpi"))]
fn over_mpi(
    args: &Args,
    _: models::Loaded,
    _: ServeSetup,
) -> anyhow::Result<Option<(infer::group::Group, Option<pd::Disaggregated>, mpi_job::End)>> {
    check_mpi(args)?;
    bail!(
        "--comm mpi: this frugal was built without MPI; build it with `cargo build --release \
         --features mpi -p frugal` and run it under `mpirun -n N`"
    )
}

/// What `--comm mpi` serves: the model split over the launcher's processes (tensor
/// parallel), or prompts on P processes of their own and decoding on rank 0.
fn check_mpi(args: &Args) -> anyhow::Result<()> {
    if args.prefill_ranks > 0 && args.tp != 1 {
        bail!(
            "--comm mpi runs either tensor-parallel ranks (mpirun -n N, --tp N) or prefill \
             ranks (mpirun -n P+1, --prefill-ranks P): use one of the two"
        );
    }
    if args.prefill_threads.is_some() {
        bail!(
            "--prefill-threads sizes prefill workers that are threads; under --comm mpi each \
             process has the cores its launcher gives it"
        );
    }
    if args.decode_ranks != 1 {
        bail!(
            "--decode-ranks {} with --comm mpi: rank 0 is the one decode worker there; run \
             several decode workers as threads (--comm threads)",
            args.decode_ranks
        );
    }
    Ok(())
}

/// `--prefill-ranks`: the decode workers (each a pool for every request, prompt chunks of one
/// token: they never prefill) on their cores, and the prefill workers started on theirs.
fn disaggregate(
    args: &Args,
    source: models::Loaded,
    setup: ServeSetup,
) -> anyhow::Result<Vec<Engine>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let prefill = args.prefill_threads.unwrap_or((cores / 2).max(1));
    if args.prefill_ranks > 64 || prefill == 0 || prefill > cores {
        bail!(
            "--prefill-ranks {} --prefill-threads {prefill}: give 1 to 64 prefill ranks on 1 to \
             {cores} threads (this machine's)",
            args.prefill_ranks
        );
    }
    let pool = crate::workers::pool;
    let decode_setup = ServeSetup {
        prefill_chunk: 1,
        ..setup
    };
    let decode = args.decode_ranks;
    let shape = source.config.shape.clone();
    let prefill_setup = ServeSetup {
        max_seqs: 1,
        kv_blocks: setup.context.div_ceil(setup.kv_block),
        ..setup
    };
    fits_together(&[
        (decode, &shape, &decode_setup),
        (args.prefill_ranks, &shape, &prefill_setup),
    ])?;
    let workers =
        (0..decode).map(|_| Ok(infer::group::Group::single(source.worker(decode_setup)?)));
    let workers = workers.collect::<anyhow::Result<Vec<_>>>()?;
    let source = Arc::new(source);
    let build: Arc<dyn Fn() -> anyhow::Result<infer::Worker> + Send + Sync> =
        Arc::new(move || source.worker(prefill_setup));
    let timeout = ::engine::world::DEFAULT_TIMEOUT;
    let comms = ::engine::world::communicators(decode + args.prefill_ranks, timeout)?;
    let prefill_pool = Arc::new(pool(prefill, "prefill")?);
    let sides = pd::Disaggregated::start(comms, decode, build, prefill_pool)?;
    let decode_threads = (cores.saturating_sub(prefill) / decode).max(1);
    eprintln!(
        "frugal serve: {} prefill ranks on {prefill} threads (each planned {} bytes), {decode} \
         decode workers on {decode_threads} threads each (each planned {} bytes)",
        args.prefill_ranks,
        plan_frugal::serve_plan(&shape, &prefill_setup)?.peak_bytes(plan::buffer::Device::Gpu),
        workers[0].plan.peak_bytes(plan::buffer::Device::Gpu)
    );
    let engines = workers
        .into_iter()
        .zip(sides)
        .map(|(w, side)| Ok((w, Some(side), pool(decode_threads, "decode")?)));
    engines.collect()
}

/// Refuses workers (`count` of each shape and setup) whose plans together exceed the RAM this
/// process may use: every worker lives in it.
fn fits_together(workers: &[(usize, &plan::ModelShape, &ServeSetup)]) -> anyhow::Result<()> {
    let mut total = 0u64;
    for &(count, shape, setup) in workers {
        let peak = plan_frugal::serve_plan(shape, setup)?.peak_bytes(plan::buffer::Device::Gpu);
        total = total.saturating_add(peak.saturating_mul(count as u64));
    }
    models::tp::fits_in_host(
        total,
        "--decode-ranks/--prefill-ranks: the workers'",
        "run fewer workers, store the weights smaller (--weights int8, int4 or nf4) or plan a \
         shorter context",
    )
}

/// SIGTERM or Ctrl-C: stop accepting connections; those open finish their requests first.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
