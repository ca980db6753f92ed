//! A model without training state: its weights and one forward pass's activations, planned by
//! `plan_frugal::forward_plan` (no gradient, optimizer or backward bytes), for exporting a
//! snapshot, computing logits and generating text. The inference engine builds on it.
//!
//! Example:
//! ```
//! use infer::runner::Runner;
//! use plan_frugal::ForwardSetup;
//! let config = engine::ModelConfig::from_shape(engine::testkit::gpt2_tiny()).unwrap();
//! let setup = ForwardSetup { batch: 1, seq: 8, attention: plan::setup::Attention::Flash };
//! let mut runner = Runner::new(config, setup).unwrap();
//! runner.init_weights(1);
//! let logits = engine::eval::logits(&mut runner, &[1, 2, 3], 1, 3).unwrap();
//! assert_eq!(logits.len(), 3 * 96);
//! assert_eq!(runner.measured().category_peak_bytes[1], 0); // no gradient bytes
//! ```

use cpu::Cpu;
use engine::arena::{Arena, Measured};
use engine::backend::{Backend, DType};
use engine::config::ModelConfig;
use engine::error::EngineError;
use engine::eval::Forward;
use engine::model::{Model, WeightSource};
use plan::buffer::{Device, MemoryPlan, Phase};
use plan_frugal::{forward_plan, ActShape, ForwardSetup};

/// A forward-only model and its arena.
pub struct Runner<B: Backend = Cpu> {
    pub plan: MemoryPlan,
    pub arena: Arena<B>,
    pub model: Model,
    pub setup: ForwardSetup,
}

impl Runner<Cpu> {
    /// A forward-only model of `config` on the CPU, sized for passes up to `setup` (zeroed
    /// weights).
    pub fn new(config: ModelConfig, setup: ForwardSetup) -> Result<Runner, EngineError> {
        Runner::on(Cpu::new(), config, setup)
    }
}

impl<B: Backend> Runner<B> {
    pub fn on(
        backend: B,
        config: ModelConfig,
        setup: ForwardSetup,
    ) -> Result<Runner<B>, EngineError> {
        let mut needs = engine::backend::model_needs(&config.shape);
        if setup.attention == plan::setup::Attention::Eager {
            needs.push(engine::backend::Feature::EagerAttention);
        }
        engine::backend::require::<B>(needs)?;
        let plan = forward_plan(&config.shape, &setup)?;
        let arena = Arena::new(backend, &plan, Device::Gpu, None)?;
        let units = plan_frugal::param_units(&config.shape, 1)?;
        let shape = ActShape {
            batch: setup.batch,
            seq: setup.seq,
        };
        let policy = setup.policy();
        let model = Model::new(config, units, &arena, shape, policy, WeightSource::Params);
        Ok(Runner {
            plan,
            arena,
            model,
            setup,
        })
    }

    /// Initialises every weight from `seed`, as `Trainer::init_weights` does.
    pub fn init_weights(&mut self, seed: u64) {
        for u in 0..self.model.units.len() {
            let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
            engine::init::fill_unit(&self.model, u, &mut full, seed);
            self.load_unit(u, &full);
        }
    }

    /// Writes unit `u`'s weights (`values`: its elements, unpadded or padded; the padding is
    /// zeroed).
    pub fn load_unit(&mut self, u: usize, values: &[f32]) {
        let t = self.arena.tensor(self.model.params[u], DType::F32);
        let mut full = vec![0.0f32; t.len];
        full[..values.len()].copy_from_slice(values);
        self.arena.backend().upload(&self.arena, t, &full);
    }

    /// Every unit's weights (unpadded), read back to the host: what an inference worker
    /// quantizes.
    pub fn unit_values(&self) -> Vec<Vec<f32>> {
        (0..self.model.units.len())
            .map(|u| {
                let t = self.arena.tensor(self.model.params[u], DType::F32);
                let mut v = vec![0.0f32; t.len];
                self.arena.backend().download(&self.arena, t, &mut v);
                v.truncate(self.model.units[u].numel as usize);
                v
            })
            .collect()
    }

    pub fn measured(&self) -> Measured {
        self.arena.measured()
    }
}

impl<B: Backend> Forward<B> for Runner<B> {
    fn parts(&self) -> (&Model, &Arena<B>) {
        (&self.model, &self.arena)
    }

    fn enter(&mut self, phase: Phase) -> Result<(), EngineError> {
        self.arena.enter(phase);
        Ok(())
    }

    fn leave(&mut self, phase: Phase) -> Result<(), EngineError> {
        self.arena.leave(phase);
        Ok(())
    }

    fn end_pass(&mut self) {
        self.arena.end_pass();
    }
}
