//! The trainer's forward-only passes (validation loss, logits, sampling) through `eval`, with
//! phases entered through the ZeRO stage so stage 3 gathers each unit: a collective, so every
//! rank runs the same forward-only passes. Leaving each phase frees what dies in it, so such a
//! pass never holds more than the training step planned.
//!
//! Example: `let loss = trainer.eval_loss(&x, &y)?;`

use super::Trainer;
use crate::zero::Pass;
use engine::arena::Arena;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::eval::{self, Forward, Sampling};
use engine::model::Model;
use plan::buffer::Phase;

impl<B: TrainOps> Forward<B> for Trainer<B> {
    fn parts(&self) -> (&Model, &Arena<B>) {
        (&self.model, &self.arena)
    }

    fn enter(&mut self, phase: Phase) -> Result<(), EngineError> {
        self.enter_phase(phase, Pass::ForwardOnly)
    }

    fn leave(&mut self, phase: Phase) -> Result<(), EngineError> {
        self.leave_phase(phase)
    }

    fn end_pass(&mut self) {
        self.arena.end_pass();
    }
}

impl<B: TrainOps> Trainer<B> {
    /// Mean cross-entropy of one micro-batch, without touching gradients.
    pub fn eval_loss(&mut self, inputs: &[u32], targets: &[u32]) -> Result<f32, EngineError> {
        let shape = (self.config.batch as usize, self.config.seq as usize);
        eval::eval_loss(self, inputs, targets, shape)
    }

    /// Logits (batch, seq, V) of `inputs` (batch ≤ micro-batch, seq ≤ planned sequence).
    pub fn logits(
        &mut self,
        inputs: &[u32],
        batch: usize,
        seq: usize,
    ) -> Result<Vec<f32>, EngineError> {
        eval::logits(self, inputs, batch, seq)
    }

    /// Continues `prompt` by `n_new` tokens; the context is cropped to the planned sequence.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_new: usize,
        sampling: Sampling,
    ) -> Result<Vec<u32>, EngineError> {
        let max_seq = self.config.seq as usize;
        eval::generate(self, prompt, n_new, max_seq, sampling)
    }

    /// As [`Trainer::generate`], stopping early (with the tokens so far) once `stop` says so.
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        n_new: usize,
        sampling: Sampling,
        stop: &dyn Fn() -> bool,
    ) -> Result<Vec<u32>, EngineError> {
        let max_seq = self.config.seq as usize;
        eval::generate_until(self, prompt, n_new, max_seq, sampling, stop)
    }

    /// Every parameter (or gradient) tensor under its HF name, in HF layout.
    pub fn export(&self, which: engine::io::Which) -> Vec<engine::io::HfTensor> {
        let ids = match which {
            engine::io::Which::Params => &self.model.params,
            engine::io::Which::Grads => &self.state.grads,
        };
        engine::io::export_ids(&self.model, &self.arena, ids)
    }
}
