//! `frugal generate --tp N`: the model split over N tensor-parallel ranks (threads of this
//! process, `infer::Worker::tensor_parallel`), each holding its share of the heads, the MLP and
//! the vocabulary; rank 0 prints the text, and every rank's planned bytes are shown beside its
//! measured ones.

use super::{check_plan, per_device, plain, Args};
use anyhow::{bail, Context};
use infer::sample::Sampling;
use infer::Worker;
use models::tp::{check_fit, fp32_units};
use models::Loaded;
use plan::buffer::Category;
use plan_frugal::ServeSetup;
use serde_json::json;
use term::{group_digits, Table};

/// What one rank ran and measured.
struct Rank {
    tokens: Vec<u32>,
    prefill_s: f64,
    total_s: f64,
    decoded: bool,
    planned: [u64; 6],
    planned_peak: u64,
    measured: engine::arena::Measured,
}

/// What every rank runs, given its endpoint.
struct Job<'a> {
    args: &'a Args,
    source: &'a Loaded,
    prompt: &'a [u32],
    setup: ServeSetup,
    sampling: Sampling,
    eos: Option<u32>,
}

impl Job<'_> {
    /// This rank's worker built, loaded and run; what it did and measured.
    fn rank(
        &self,
        comm: Box<dyn comm::Collective>,
        capacity: Option<u64>,
    ) -> Result<Rank, engine::EngineError> {
        let config = self.source.config.clone();
        let mut worker =
            Worker::tensor_parallel(cpu::Cpu::new(), config, self.setup, comm, capacity)?;
        self.source.load_whole(&mut worker)?;
        let t0 = std::time::Instant::now();
        let a = self.args;
        let (tokens, prefill_s, steps) = plain(
            &mut worker,
            self.prompt,
            a.max_new_tokens,
            &self.sampling,
            a.seed,
            self.eos,
        )
        .map_err(|e| match e.downcast::<engine::EngineError>() {
            Ok(e) => e,
            Err(e) => engine::EngineError::Infer(format!("{e:#}")),
        })?;
        let decoded = steps > 0;
        let (planned, planned_peak) = super::phases_run(&worker, decoded);
        Ok(Rank {
            tokens,
            prefill_s,
            total_s: t0.elapsed().as_secs_f64(),
            decoded,
            planned,
            planned_peak,
            measured: worker.measured(),
        })
    }
}

pub(super) fn run(
    args: &Args,
    source: &Loaded,
    tok: &data::Tokenizer,
    prompt: &[u32],
    setup: ServeSetup,
    sampling: Sampling,
) -> anyhow::Result<()> {
    let tp = args.tp;
    if args.draft.is_some() || args.save_quantized.is_some() {
        bail!("--tp {tp} runs one model split over ranks: it takes neither --draft nor --save-quantized");
    }
    fp32_units(args.tp, &args.model, source)?;
    let setup = ServeSetup {
        weights: source.narrow(setup.weights)?,
        ..setup
    };
    let job = Job {
        args,
        source,
        prompt,
        setup,
        sampling,
        eos: tok.eos(),
    };
    if args.comm == comm::Transport::Mpi {
        return over_mpi(&job, tok);
    }
    check_fit(&source.config.shape, &setup, tp)?;
    let ranks = engine::world::launch(
        tp,
        engine::world::DEFAULT_TIMEOUT,
        |comm| job.rank(comm, None),
        engine::world::comm_failure,
    )?;
    report(args, tok, prompt, &ranks)
}

/// `--comm mpi`: this process is one rank of the launcher's job (`--tp` its size); each rank
/// checks its own plan against its machine, and rank 0 gathers every rank's bytes and reports.
#[cfg(feature = "mpi")]
fn over_mpi(job: &Job, tok: &data::Tokenizer) -> anyhow::Result<()> {
    use comm::Collective;
    let mut world = comm::Mpi::init(engine::world::DEFAULT_TIMEOUT, |why| {
        eprintln!("error: {why}")
    })?;
    let (rank, size) = (world.rank(), world.world_size());
    let result = (|| -> anyhow::Result<()> {
        if job.args.tp != 1 && job.args.tp != size {
            bail!(
                "--tp {} with --comm mpi: the ranks are the launcher's {size} processes (-n); \
                 leave --tp out",
                job.args.tp
            );
        }
        // The worker's endpoint; `world` stays for the report's gather.
        let comm = world.split(0, rank as u32)?;
        // The processes on this machine share its memory (a collective: every rank asks).
        let here = world.node_ranks() as u64;
        let capacity = engine::capacity::host_available().map(|h| h.bytes / here.max(1));
        let mine = job.rank(comm, capacity)?;
        let m = &mine.measured;
        let mut values: Vec<u64> = mine.planned.to_vec();
        values.extend([mine.planned_peak]);
        values.extend(m.category_peak_bytes);
        values.extend([m.peak_bytes, u64::from(mine.decoded)]);
        let all = world.all_gather_u64(&values)?;
        if rank != 0 {
            return Ok(());
        }
        let ranks: Vec<Rank> = all
            .chunks_exact(values.len())
            .map(|v| Rank {
                tokens: mine.tokens.clone(),
                prefill_s: mine.prefill_s,
                total_s: mine.total_s,
                decoded: v[14] == 1,
                planned: v[..6].try_into().expect("six categories"),
                planned_peak: v[6],
                measured: engine::arena::Measured {
                    category_peak_bytes: v[7..13].try_into().expect("six categories"),
                    peak_bytes: v[13],
                    ..Default::default()
                },
            })
            .collect();
        report(job.args, tok, job.prompt, &ranks)
    })();
    if let Err(e) = &result {
        if size > 1 {
            eprintln!("error: rank {rank}: {e:#}");
            comm::Mpi::abort_world(2);
        }
    }
    drop(world);
    comm::Mpi::finalize();
    result
}

/// Without the feature: the flag is known, the backend is not built in.
#[cfg(not(feature = "mpi"))]
fn over_mpi(_: &Job, _: &data::Tokenizer) -> anyhow::Result<()> {
    bail!(
        "--comm mpi: this frugal was built without MPI; build it with `cargo build --release \
         --features mpi -p frugal` and run it under `mpirun -n N`"
    )
}

fn report(
    args: &Args,
    tok: &data::Tokenizer,
    prompt: &[u32],
    ranks: &[Rank],
) -> anyhow::Result<()> {
    let lead = &ranks[0];
    let mut tokens = lead.tokens.clone();
    if let Some(at) = tok.eos().and_then(|e| tokens.iter().position(|&t| t == e)) {
        tokens.truncate(at);
    }
    let text = tok.decode(&tokens).unwrap_or_default();
    let prefill_tps = prompt.len() as f64 / lead.prefill_s.max(1e-9);
    let decode_tps = tokens.len() as f64 / (lead.total_s - lead.prefill_s).max(1e-9);
    if args.json {
        let per_rank: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, k)| {
                json!({
                    "rank": r,
                    "planned": per_device(k.planned, k.planned_peak),
                    "measured": per_device(k.measured.category_peak_bytes, k.measured.peak_bytes),
                })
            })
            .collect();
        let v = json!({
            "tokens": tokens,
            "text": text,
            "tp": ranks.len(),
            "prompt_tokens": prompt.len(),
            "prompt_token_ids": prompt,
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "ranks": per_rank,
        });
        println!("{v}");
    } else {
        match &args.chat {
            Some(_) => println!("{text}"),
            None => println!("{}{}", args.prompt, text),
        }
        let cats: Vec<Category> = Category::ALL
            .into_iter()
            .filter(|&c| ranks.iter().any(|k| k.planned[c as usize] > 0))
            .collect();
        let mut head = vec!["rank".to_string()];
        head.extend(cats.iter().map(|c| c.label().to_string()));
        head.extend(["planned peak".into(), "measured peak".into()]);
        let head: Vec<&str> = head.iter().map(String::as_str).collect();
        let mut t = Table::new(&head);
        for (r, k) in ranks.iter().enumerate() {
            let mut row = vec![r.to_string()];
            row.extend(cats.iter().map(|&c| group_digits(k.planned[c as usize])));
            row.push(group_digits(k.planned_peak));
            row.push(group_digits(k.measured.peak_bytes));
            t.row(row);
        }
        eprintln!();
        eprintln!(
            "{} tensor-parallel ranks · prefill {} tokens at {prefill_tps:.1} tokens/s · decode {} \
             tokens at {decode_tps:.1} tokens/s; each rank's planned bytes and its measured peak:",
            ranks.len(),
            prompt.len(),
            tokens.len()
        );
        eprint!("{}", t.render());
    }
    for (r, k) in ranks.iter().enumerate() {
        check_plan(k.planned, k.planned_peak, &k.measured).with_context(|| {
            format!("rank {r}{}", if k.decoded { "" } else { " (prefill only)" })
        })?;
    }
    Ok(())
}
