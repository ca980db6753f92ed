//! A replay of PyTorch's eager memory behaviour: tensors, autograd's saved tensors, and backward.
//!
//! The model code (`blocks.rs`) writes the forward pass op by op as HF transformers runs it: each
//! op allocates its outputs, marks what autograd saves for backward, and the Python variables that
//! held a tensor drop it when HF's code would. A tensor is freed when nothing refers to it, exactly
//! like a `torch.Tensor` whose refcount hits zero; every allocation is rounded up to the caching
//! allocator's 512 bytes. `backward` then walks the recorded ops in reverse as the autograd engine
//! does: it allocates each input's gradient, accumulates repeated gradients in place, steals a
//! parameter's first gradient as its `.grad`, and releases the op's saved tensors. This holds no
//! model knowledge; example: `let y = tape.alloc(bytes, Category::Activations); tape.save(op, y)`.

use plan::{Category, Phase};

/// Index of a tensor in the tape.
pub type T = usize;

/// The caching allocator hands out multiples of 512 bytes (`kMinBlockSize`).
pub fn round_512(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(512) * 512
}

/// One allocation event, in program order; phases mark where the step is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    Alloc(T),
    Free(T),
    Phase(Phase),
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub bytes: u64,
    pub category: Category,
    refs: u32,
    saved: u32,
    live: bool,
    /// `.grad` of this parameter, once backward produced one.
    grad: Option<T>,
    /// A parameter with `requires_grad=False` (frozen LoRA base, quantized storage).
    frozen: bool,
}

/// How an op's backward produces the gradient of one of its inputs.
#[derive(Clone, Copy, Debug)]
pub enum Grad {
    /// A new tensor of the input's size (and dtype).
    New(T),
    /// The output's gradient itself, passed through (a same-dtype add).
    Alias(T),
    /// A weight gradient of `bytes` computed in the op; `param` receives it as its `.grad`
    /// (through a cast when the op ran on an autocast copy of the parameter).
    Param { param: T, bytes: u64 },
}

#[derive(Clone, Debug, Default)]
pub struct Op {
    outputs: Vec<T>,
    saved: Vec<T>,
    grads: Vec<Grad>,
    /// Scratch the backward kernel allocates and frees (flash attention's fp32 dq accumulator).
    temps: Vec<u64>,
}

/// The tape: tensors, recorded ops, the event log and live/peak accounting.
#[derive(Clone, Debug, Default)]
pub struct Tape {
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
    pub events: Vec<Event>,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// Live bytes by category at the peak.
    pub peak_by_category: [u64; 6],
    live_by_category: [u64; 6],
    /// While true (non-reentrant checkpointing's forward), ops record nothing for backward.
    pub no_record: bool,
    /// Gradients of activations, by tensor.
    act_grads: std::collections::HashMap<T, T>,
    /// A parameter's gradient is copied out and released as soon as it is produced (DeepSpeed
    /// ZeRO 2-3's gradient hooks with `contiguous_gradients`: into the reduce bucket).
    pub reduce_on_hook: bool,
}

impl Tape {
    /// A new tensor held by one Python reference.
    pub fn alloc(&mut self, bytes: u64, category: Category) -> T {
        let id = self.tensors.len();
        self.tensors.push(Tensor {
            bytes: round_512(bytes),
            category,
            refs: 1,
            saved: 0,
            live: true,
            grad: None,
            frozen: false,
        });
        self.count_alloc(id);
        id
    }

    fn count_alloc(&mut self, id: T) {
        let (bytes, category) = (self.tensors[id].bytes, self.tensors[id].category);
        self.live_bytes += bytes;
        self.live_by_category[category as usize] += bytes;
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            self.peak_by_category = self.live_by_category;
        }
        self.events.push(Event::Alloc(id));
    }

    /// Frees the storage of `t` while references to it remain (a ZeRO-3 parameter partitioned
    /// away after use: the Python object stays, its data is released).
    pub fn release(&mut self, t: T) {
        let x = &mut self.tensors[t];
        if x.live {
            x.live = false;
            self.live_bytes -= x.bytes;
            self.live_by_category[x.category as usize] -= x.bytes;
            self.events.push(Event::Free(t));
        }
    }

    /// Rewrites the history so far as if every released tensor had never held storage: ZeRO-3's
    /// `zero.Init` partitions each parameter as it is created, so the whole model never exists
    /// on one device. The live tensors stay, allocated in their order; the peak restarts there.
    pub fn forget_released(&mut self) {
        let live: Vec<Event> = self
            .events
            .iter()
            .filter(|e| match e {
                Event::Alloc(t) => self.tensors[*t].live,
                Event::Free(_) => false,
                Event::Phase(_) => true,
            })
            .cloned()
            .collect();
        self.events = live;
        self.peak_bytes = self.live_bytes;
        self.peak_by_category = self.live_by_category;
    }

    /// The highest live bytes inside each phase of `phases` (by ordinal) and the categories at
    /// that moment, replayed from the event log: the timeline the report plots, whose maximum
    /// is [`Tape::peak_bytes`]. A phase the log never enters keeps the bytes live before it.
    pub fn phase_peaks(&self, phases: &[Phase], n_layers: u32) -> Vec<(Phase, [u64; 6])> {
        let mut best: Vec<Option<[u64; 6]>> = vec![None; phases.len()];
        let index = |p: Phase| {
            let o = p.ordinal(n_layers) as usize;
            (o < phases.len()).then_some(o)
        };
        let mut live = [0u64; 6];
        let mut at = index(phases[0]);
        let mut note = |at: Option<usize>, live: &[u64; 6]| {
            if let Some(i) = at {
                let sum: u64 = live.iter().sum();
                if best[i].is_none_or(|b| sum > b.iter().sum()) {
                    best[i] = Some(*live);
                }
            }
        };
        for e in &self.events {
            match *e {
                Event::Phase(p) => {
                    at = index(p);
                    note(at, &live);
                }
                Event::Alloc(t) => {
                    live[self.tensors[t].category as usize] += self.tensors[t].bytes;
                    note(at, &live);
                }
                Event::Free(t) => live[self.tensors[t].category as usize] -= self.tensors[t].bytes,
            }
        }
        let mut carry = [0u64; 6];
        phases
            .iter()
            .zip(best)
            .map(|(&p, b)| {
                let c = b.unwrap_or(carry);
                carry = c;
                (p, c)
            })
            .collect()
    }

    /// Gives a released `t` its storage back (a ZeRO-3 all-gather).
    pub fn restore(&mut self, t: T) {
        if !self.tensors[t].live {
            self.tensors[t].live = true;
            self.count_alloc(t);
        }
    }

    /// Marks parameter `t` as `requires_grad=False`: backward computes no gradient for it.
    pub fn freeze(&mut self, t: T) {
        self.tensors[t].frozen = true;
    }

    /// Whether `t` is a parameter that receives a gradient (every activation does).
    pub fn requires_grad(&self, t: T) -> bool {
        !self.tensors[t].frozen
    }

    pub fn phase(&mut self, phase: Phase) {
        self.events.push(Event::Phase(phase));
    }

    /// Another Python reference (a second variable, a cache) to `t`.
    pub fn hold(&mut self, t: T) {
        self.tensors[t].refs += 1;
    }

    /// A Python reference to `t` goes away.
    pub fn drop(&mut self, t: T) {
        let x = &mut self.tensors[t];
        debug_assert!(x.refs > 0, "tensor {t} dropped twice");
        x.refs = x.refs.saturating_sub(1);
        self.maybe_free(t);
    }

    /// Python references to each of `ts` go away, in order.
    pub fn drop_all(&mut self, ts: &[T]) {
        for &t in ts {
            self.drop(t);
        }
    }

    fn maybe_free(&mut self, t: T) {
        let x = &mut self.tensors[t];
        if x.live && x.refs == 0 && x.saved == 0 {
            x.live = false;
            self.live_bytes -= x.bytes;
            self.live_by_category[x.category as usize] -= x.bytes;
            self.events.push(Event::Free(t));
        }
    }

    /// Records an op producing `outputs`; returns its index for [`Tape::save`] and [`Tape::grads`].
    pub fn op(&mut self, outputs: &[T]) -> Option<usize> {
        if self.no_record {
            return None;
        }
        self.ops.push(Op {
            outputs: outputs.to_vec(),
            ..Op::default()
        });
        Some(self.ops.len() - 1)
    }

    /// Autograd keeps `t` until `op`'s backward has run.
    pub fn save(&mut self, op: Option<usize>, t: T) {
        if let Some(op) = op {
            self.tensors[t].saved += 1;
            self.ops[op].saved.push(t);
        }
    }

    pub fn grads(&mut self, op: Option<usize>, grads: &[Grad]) {
        if let Some(op) = op {
            self.ops[op].grads.extend_from_slice(grads);
        }
    }

    pub fn temps(&mut self, op: Option<usize>, bytes: &[u64]) {
        if let Some(op) = op {
            self.ops[op].temps.extend_from_slice(bytes);
        }
    }

    /// Seeds backward with the gradient of `t` (the loss: `torch.ones_like`).
    pub fn seed_grad(&mut self, t: T) {
        let g = self.alloc(self.tensors[t].bytes, Category::Activations);
        self.act_grads.insert(t, g);
    }

    /// Moves the pending gradient of `from` to `to` (a recomputed copy of the same value).
    pub fn move_grad(&mut self, from: T, to: T) {
        if let Some(g) = self.act_grads.remove(&from) {
            self.act_grads.insert(to, g);
        }
    }

    /// Runs the backward of ops `from..to` in reverse order, as the autograd engine does.
    pub fn backward(&mut self, from: usize, to: usize) {
        for i in (from..to).rev() {
            let op = std::mem::take(&mut self.ops[i]);
            self.backward_op(&op);
        }
    }

    fn backward_op(&mut self, op: &Op) {
        let has_grad = op.outputs.iter().any(|o| self.act_grads.contains_key(o));
        if has_grad {
            let temps: Vec<T> = op
                .temps
                .iter()
                .map(|&b| self.alloc(b, Category::Activations))
                .collect();
            for &g in &op.grads {
                self.produce_grad(g, op);
            }
            for t in temps {
                self.drop(t);
            }
        }
        for &o in &op.outputs {
            if let Some(g) = self.act_grads.remove(&o) {
                self.drop(g);
            }
        }
        for &s in &op.saved {
            self.tensors[s].saved -= 1;
            self.maybe_free(s);
        }
    }

    fn produce_grad(&mut self, g: Grad, op: &Op) {
        match g {
            Grad::New(input) => {
                let fresh = self.alloc(self.tensors[input].bytes, Category::Activations);
                self.accumulate(input, fresh);
            }
            Grad::Alias(input) => {
                let out_grad = op
                    .outputs
                    .iter()
                    .find_map(|o| self.act_grads.get(o).copied());
                if let Some(out_grad) = out_grad {
                    if self.act_grads.contains_key(&input) {
                        return; // added in place into the existing buffer
                    }
                    self.hold(out_grad);
                    self.act_grads.insert(input, out_grad);
                }
            }
            Grad::Param { param, .. } if self.tensors[param].frozen => {}
            Grad::Param { param, bytes } => {
                let fresh = self.alloc(bytes, Category::Grads);
                let param_bytes = self.tensors[param].bytes;
                let fresh = if self.tensors[fresh].bytes != param_bytes {
                    // Autocast's cast backward: the bf16 weight gradient becomes a param-dtype one.
                    let cast = self.alloc(param_bytes, Category::Grads);
                    self.drop(fresh);
                    cast
                } else {
                    fresh
                };
                match self.tensors[param].grad {
                    None if self.reduce_on_hook => self.drop(fresh),
                    // AccumulateGrad steals the first gradient as `.grad`...
                    None => self.tensors[param].grad = Some(fresh),
                    // ...and adds later ones in place.
                    Some(_) => self.drop(fresh),
                }
            }
        }
    }

    fn accumulate(&mut self, input: T, fresh: T) {
        match self.act_grads.entry(input) {
            // `InputBuffer::add` sums in place into the first gradient.
            std::collections::hash_map::Entry::Occupied(_) => self.drop(fresh),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(fresh);
            }
        }
    }

    /// Frees every gradient still pending (the embedding's input gradients end here).
    pub fn drop_pending_grads(&mut self) {
        let pending: Vec<T> = self.act_grads.drain().map(|(_, g)| g).collect();
        for g in pending {
            self.drop(g);
        }
    }

    /// `optimizer.zero_grad(set_to_none=True)`: every `.grad` is released.
    pub fn zero_grad(&mut self, params: &[T]) {
        for &p in params {
            if let Some(g) = self.tensors[p].grad.take() {
                self.drop(g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_tensor_outlives_its_variable_until_backward() {
        let mut t = Tape::default();
        let x = t.alloc(1000, Category::Activations); // 1024 after rounding
        let op = t.op(&[]);
        let y = t.alloc(512, Category::Activations);
        t.ops[op.unwrap()].outputs.push(y);
        t.save(op, x);
        t.grads(op, &[Grad::New(x)]);
        t.drop(x);
        assert_eq!(t.live_bytes, 1024 + 512);
        t.seed_grad(y);
        t.backward(0, 1);
        // x's gradient (1024) is pending; x itself and y's gradient are gone.
        assert_eq!(t.live_bytes, 512 + 1024);
        assert_eq!(t.peak_bytes, 1024 + 512 + 512 + 1024);
    }
}
