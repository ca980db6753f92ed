//! One optimizer step's micro-batches on a pipeline stage, scheduled 1F1B (PipeDream-Flush,
//! Megatron's non-interleaved schedule): stage `s` of `p` runs `w = min(p - s - 1, m)` forwards,
//! then `m - w` pairs of one forward and one backward, then the last `w` backwards. Its forward
//! receives its input from the previous stage (the first embeds the tokens), its backward its
//! output gradient from the next (the last stage's head computes it right after its forward);
//! each send pairs with the neighbour's receive in the same order (`pp::Pipeline`).
//!
//! Between a micro-batch's forward and its backward a stage other than the last stashes what the
//! forward kept and parks those buffers, so the next forward reuses them; the backward revives
//! and restores them. The arena thus goes through one micro-batch's phases at a time, and its
//! measured peak is the plan's: one micro-step's timeline plus the stash slots.
//!
//! Example: with p = 2 and m = 4, stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3, stage 1 F0 B0 F1 B1 ….

use super::Trainer;
use crate::zero::Pass;
use crate::{backward, forward};
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::pp::{Pipeline, Side};
use plan::buffer::Phase;

type Batch<'a> = (&'a mut Vec<u32>, &'a mut Vec<u32>);

impl<B: TrainOps> Trainer<B> {
    /// Runs `grad_accum` micro-batches through this stage under 1F1B; returns the sum of the
    /// token losses (the last stage's; zero elsewhere). The stage's links are taken out of the
    /// model for the step and put back, also on an error.
    pub(super) fn pipeline_steps(
        &mut self,
        next_batch: &mut dyn FnMut(&mut [u32], &mut [u32]),
        batch: Batch<'_>,
        dloss: f32,
    ) -> Result<f64, EngineError> {
        let pipe = self.model.pp.take().expect("a pipeline stage");
        let started = std::time::Instant::now();
        let result = self.schedule(&pipe, next_batch, batch, dloss);
        pipe.scheduled.set(pipe.scheduled.get() + started.elapsed());
        let result = result.and_then(|sum| self.after_schedule(&pipe, sum));
        self.model.pp = Some(pipe);
        result
    }

    /// After the micro-batches: a tied embedding's two copies take their summed gradient (the
    /// last stage's copy took the head's, the first stage's the embedding's; whole fp32
    /// gradients: ZeRO 0-1, fp32), and every stage learns the last stage's loss sum.
    fn after_schedule(&mut self, pipe: &Pipeline, loss_sum: f64) -> Result<f64, EngineError> {
        let stage = pipe.stage;
        if self.config.model.shape.tied_embeddings && (stage.is_first() || stage.is_last()) {
            let embed = self
                .arena
                .tensor(self.state.grads[0], engine::backend::DType::F32);
            pipe.sum_embedding(&self.arena, embed)?;
        }
        pipe.from_last(loss_sum)
    }

    /// A pipeline stage's time inside exchanges and inside the 1F1B schedule so far: its idle
    /// fraction is their ratio (`None` without a pipeline).
    pub fn pipeline_time(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        let pp = self.model.pp.as_ref()?;
        Some((pp.idle.get(), pp.scheduled.get()))
    }

    fn schedule(
        &mut self,
        pipe: &Pipeline,
        next_batch: &mut dyn FnMut(&mut [u32], &mut [u32]),
        (inputs, targets): Batch<'_>,
        dloss: f32,
    ) -> Result<f64, EngineError> {
        let m = self.config.grad_accum;
        let stage = pipe.stage;
        let (w, last) = (stage.warmup(m), stage.is_last());
        let mut loss_sum = 0.0f64;
        // Whether the exchange buffer holds the next forward's input / backward's gradient.
        let (mut input_ready, mut grad_ready) = (false, false);
        let mut forward = |t: &mut Self, i: u32, ready: bool| -> Result<(), EngineError> {
            t.micro = i;
            next_batch(inputs, targets);
            t.load_batch(inputs, targets)?;
            loss_sum += t.stage_forward(pipe, ready, dloss)?;
            Ok(())
        };
        for i in 0..w {
            forward(self, i, false)?;
            self.send_forward(pipe)?;
            pipe.stash(&mut self.arena, i as usize);
        }
        for k in 0..m - w {
            forward(self, w + k, input_ready)?;
            if !last {
                // send_forward_recv_backward: this micro-batch out, micro-batch k's gradient in.
                self.send_forward(pipe)?;
                grad_ready = true;
                pipe.stash(&mut self.arena, (w + k) as usize);
            }
            // send_backward_recv_forward (the next forward's input), or the last send.
            self.stage_backward(pipe, k, grad_ready)?;
            (grad_ready, input_ready) = (false, k + 1 < m - w);
        }
        for k in m - w..m {
            self.stage_backward(pipe, k, false)?;
        }
        self.check_tp()?;
        Ok(loss_sum)
    }

    /// A micro-batch's forward on this stage (the last stage's head included); `ready`: its
    /// input was received by the last exchange.
    fn stage_forward(
        &mut self,
        pipe: &Pipeline,
        ready: bool,
        dloss: f32,
    ) -> Result<f64, EngineError> {
        let (b, t) = (self.config.batch as usize, self.config.seq as usize);
        let pass = Pass::Training;
        self.enter_phase(Phase::Embed, pass)?;
        let encoded = self.model.head.encoded;
        match pipe.stage.is_first() {
            true => forward::embed(&self.model, &self.arena, b, t),
            false => {
                if !ready {
                    pipe.exchange(&self.arena, Side::Prev, encoded)?;
                }
                pipe.take(&self.arena, Side::Prev, encoded);
            }
        }
        self.leave_phase(Phase::Embed)?;
        for l in 0..self.model.config.shape.n_layers {
            self.enter_phase(Phase::Forward(l), pass)?;
            forward::block(&self.model, &self.arena, l as usize, b, t);
            self.leave_phase(Phase::Forward(l))?;
        }
        if !pipe.stage.is_last() {
            return Ok(0.0);
        }
        self.enter_phase(Phase::Head, pass)?;
        let sum = backward::head(&self.model, &self.state, &self.arena, dloss);
        self.leave_phase(Phase::Head)?;
        Ok(f64::from(sum))
    }

    /// Sends the stage's output to the next stage; what comes back (in 1F1B's steady state the
    /// gradient of the micro-batch whose backward is next) stays in the exchange buffer.
    fn send_forward(&mut self, pipe: &Pipeline) -> Result<(), EngineError> {
        if pipe.stage.is_last() {
            return Ok(());
        }
        let out = self.model.forward_blocks[self.model.forward_blocks.len() - 1].out;
        pipe.exchange(&self.arena, Side::Next, out)
    }

    /// Micro-batch `k`'s backward on this stage; `ready`: its output gradient was received by
    /// the last exchange. Its send to the previous stage brings back that stage's next output
    /// where the schedule has one (left in the exchange buffer).
    fn stage_backward(&mut self, pipe: &Pipeline, k: u32, ready: bool) -> Result<(), EngineError> {
        let pass = Pass::Training;
        let n_layers = self.model.config.shape.n_layers;
        self.micro = k;
        if !pipe.stage.is_last() {
            pipe.unstash(&mut self.arena, k as usize);
            self.enter_phase(Phase::Head, pass)?;
            let dres = self.state.dresidual;
            if !ready {
                pipe.exchange(&self.arena, Side::Next, dres)?;
            }
            pipe.take(&self.arena, Side::Next, dres);
            self.leave_phase(Phase::Head)?;
        }
        for l in (0..n_layers).rev() {
            self.enter_phase(Phase::Backward(l), pass)?;
            backward::block(&self.model, &self.state, &self.arena, l as usize);
            self.leave_phase(Phase::Backward(l))?;
        }
        self.enter_phase(Phase::EmbedBackward, pass)?;
        match pipe.stage.is_first() {
            true => backward::embed(&self.model, &self.state, &self.arena),
            false => pipe.exchange(&self.arena, Side::Prev, self.state.dresidual)?,
        }
        self.leave_phase(Phase::EmbedBackward)?;
        Ok(())
    }
}
