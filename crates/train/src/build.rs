//! Building one rank's trainer: its place in the 3D world (`tp::Place`), its communicators, its
//! plan (refused before anything is allocated when it does not fit), its arena, its model (its
//! share of the whole model under tensor or pipeline parallelism), its training state and ZeRO
//! sharding.
//!
//! Example: `Trainer::on(Cpu::new(), config, comm)?` on every rank of a world of `config.ranks`.

use super::{config, mixed, tp, Timings, TrainConfig, TrainState, Trainer};
use crate::precision::LossScaler;
use crate::zero::Sharding;
use comm::Collective;
use engine::arena::Arena;
use engine::backend::DType;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::model::{Model, WeightSource};
use engine::share::Share;
use plan::buffer::Device;
use plan::setup::{Offload, Precision};
use plan_frugal::key::Work;
use plan_frugal::{ActShape, Key, StateRule};

impl<B: TrainOps> Trainer<B> {
    /// A trainer for one rank on `backend`.
    pub fn on(
        backend: B,
        config: TrainConfig,
        comm: Box<dyn Collective>,
    ) -> Result<Trainer<B>, EngineError> {
        engine::backend::require::<B>(config.needs())?;
        let (world_rank, world) = (comm.rank(), comm.world_size());
        assert_eq!(world, config.ranks as usize, "one communicator per rank");
        let place = tp::Place::of(world_rank, config.tp.max(1), config.dp(), config.pp.max(1));
        let plan = config::check_capacity_of(&config, place.tp_rank, place.stage)?;
        let replicas = match place.tp > 1 {
            true => plan_frugal::tp::kv_replicas(&config.model.shape, place.tp),
            false => 1,
        };
        let mut comms = tp::Comms::split(comm, place, replicas)?;
        let (comm, rank) = (comms.dp, place.dp_rank as usize);
        let mixed = config.mixed.clone();
        let shape = &config.model.shape;
        let setup = config.setup();
        let scaler = match (&mixed.loss_scaler, mixed.precision) {
            (Some(c), Precision::Fp16) => Some(LossScaler::new(*c)?),
            (None, Precision::Fp16) => Some(LossScaler::torch()),
            _ => None,
        };
        let arena = Arena::new(backend, &plan, Device::Gpu, config.device_memory_bytes)?;
        let stage = plan_frugal::place::stage_of(shape, &setup, place.stage);
        let units = plan_frugal::stage_units(shape, &setup, place.tp_rank, stage)?;
        let kv_group = comms.kv.take();
        let tp_group = comms.tp.take().map(|c| {
            let mut tp = engine::tp::TensorParallel::new(shape.vocab, c);
            if let Some(kv) = kv_group {
                tp.share_kv(kv, arena.key_tensor(Key::Work(Work::TpKv), DType::F32));
            }
            Box::new(tp)
        });
        let share = match comms.world.is_some() {
            true => Some(Box::new(Share::new(
                config.model.clone(),
                (place.tp_rank, place.tp),
                stage,
            )?)),
            false => None,
        };
        let model_config = match &share {
            Some(s) => s.rank_config(),
            None => config.model.clone(),
        };
        let act_shape = ActShape {
            batch: config.batch,
            seq: config.seq,
        };
        let policy = plan_frugal::ActPolicy::of(&setup);
        let rule = StateRule::of(&setup);
        // ZeRO-3's prefetch runs beside the computation on the link's own thread.
        let comm = match config.overlap_comm && rule.params_sharded() && comm.world_size() > 1 {
            true => Box::new(comm::Overlapped::new(comm)),
            false => comm,
        };
        let source = match rule.gathers() {
            true => WeightSource::Gathers,
            false => WeightSource::Params,
        };
        let mut model = Model::new(model_config, units, &arena, act_shape, policy, source);
        if let Some(lora) = &config.lora {
            model.attach_lora(&arena, &lora.plan, lora.alpha);
        }
        (model.tp, model.share) = (tp_group, share);
        if let Some(links) = comms.pp.take() {
            model.pp = Some(Box::new(engine::pp::Pipeline::new(
                stage, links, &plan, &arena,
            )));
        }
        let offloaded = mixed.offload == Offload::Optimizer;
        let half = DType::half_of(mixed.precision);
        let fp32_opt = !offloaded && half.is_none();
        let masters = !offloaded && half.is_some();
        let state = TrainState::new(&model, &arena, setup.optimizer, fp32_opt, masters);
        for ids in &state.opt {
            let be = arena.backend();
            ids.iter()
                .for_each(|&id| be.fill(&arena, arena.tensor(id, DType::F32), 0.0));
        }
        let offload = match mixed.offload {
            Offload::Optimizer => Some(mixed::offload_store(
                &model,
                rule,
                (world_rank, world),
                &mixed,
            )?),
            _ => None,
        };
        let sharding = Sharding::new(rule, half, rank, &model, &arena);
        let n = (config.batch * config.seq) as usize;
        let n_units = model.units.len();
        Ok(Trainer {
            config,
            plan,
            arena,
            model,
            state,
            step: 0,
            timings: Timings::default(),
            sharding,
            last_step_comm: comm::CommStats::default(),
            comm: comm::Counted::new(comm),
            world: comms.world.map(comm::Counted::new),
            world_rank,
            scaler,
            offload,
            skipped_steps: 0,
            last_skipped: false,
            batch: (vec![0; n], vec![0; n]),
            slices: Vec::with_capacity(n_units),
            micro: 0,
        })
    }
}
