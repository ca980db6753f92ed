//! Pipeline parallelism: one stage's links to its neighbours and to the other stages of its
//! pipeline, and the stash of its in-flight micro-batches (`plan_frugal::pp`).
//!
//! A send or receive between neighbouring stages is one exchange over the pair's own
//! two-rank communicator: an all-gather of the boundary tensor (an activation forward, its
//! gradient backward; the same shape both ways) into `work.pp_exchange`, each side taking the
//! other's half. Megatron's 1F1B schedule pairs every stage's calls with its neighbour's in the
//! same order (`send_forward_recv_backward` against `send_backward_recv_forward`, a plain send
//! against a plain receive, whose other half is not read), so blocking exchanges never
//! deadlock; the time a stage spends inside them is its idle time (the bubble, and waiting on a
//! slower neighbour).
//!
//! Example: `pp.exchange(arena, Side::Next, block_out)?; pp.take(arena, Side::Next, dresidual)`.

use crate::arena::{Arena, BufId};
use crate::backend::{Backend, CommOp, DType, Tensor};
use crate::error::EngineError;
use crate::share::Share;
use comm::{BufMut, Collective, CommError};
use plan::buffer::MemoryPlan;
use plan_frugal::key::Work;
use plan_frugal::pp::Stage;
use plan_frugal::units::Unit;
use plan_frugal::Key;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// Which neighbour an exchange is with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Prev,
    Next,
}

type Link = RefCell<comm::Counted<Box<dyn Collective>>>;

/// The communicators of one stage, split from the world by `Pipeline::split`.
pub struct Links {
    pub prev: Option<Box<dyn Collective>>,
    pub next: Option<Box<dyn Collective>>,
    /// Every stage of this rank's pipeline (the ranks with its data- and tensor-parallel place).
    pub group: Box<dyn Collective>,
    /// The first and last stage, for a tied embedding's two copies.
    pub embed: Option<Box<dyn Collective>>,
}

impl Links {
    /// Splits `world` into the links of stage `stage` of `pp`, where `replica` ranks (dp × tp)
    /// share a stage: rank = stage · replica + place. A collective every rank calls.
    pub fn split(world: &mut dyn Collective, pp: u32, replica: u32) -> Result<Links, CommError> {
        let rank = world.rank() as u32;
        let (stage, place) = (rank / replica, rank % replica);
        // Pairs (0,1), (2,3), ... then (1,2), (3,4), ...: each stage meets each neighbour once.
        let even = world.split((stage / 2) * replica + place, rank)?;
        let odd = world.split(stage.div_ceil(2) * replica + place, rank)?;
        let group = world.split(place, rank)?;
        let ends = stage == 0 || stage + 1 == pp;
        let embed = world.split(if ends { place } else { replica + rank }, rank)?;
        let (mut even, mut odd) = (Some(even), Some(odd));
        let (next, prev) = match stage % 2 {
            0 => (even.take(), odd.take()),
            _ => (odd.take(), even.take()),
        };
        Ok(Links {
            prev: prev.filter(|_| stage > 0),
            next: next.filter(|_| stage + 1 < pp),
            group,
            embed: Some(embed).filter(|_| ends && pp > 1),
        })
    }
}

/// One pipeline stage.
pub struct Pipeline {
    pub stage: Stage,
    prev: Option<Link>,
    next: Option<Link>,
    group: Link,
    embed: Option<Link>,
    /// `work.pp_exchange`: what this stage sends and what it receives, one half each.
    pub exchange: Tensor,
    /// The buffers live across the forward/backward boundary (parked after a forward, revived
    /// for a backward) and, of them, the saved activations each stash slot holds.
    pub kept: Vec<BufId>,
    pub stashed: Vec<BufId>,
    pub stash: Vec<BufId>,
    /// Time spent inside exchanges so far (this stage's idle time), and inside the schedule.
    pub idle: Cell<Duration>,
    pub scheduled: Cell<Duration>,
}

fn link(c: Option<Box<dyn Collective>>) -> Option<Link> {
    c.map(|c| RefCell::new(comm::Counted::new(c)))
}

impl Pipeline {
    /// Stage `stage` over `links`, with the exchange buffer and stash slots of `plan` in `arena`.
    pub fn new<B: Backend>(
        stage: Stage,
        links: Links,
        plan: &MemoryPlan,
        arena: &Arena<B>,
    ) -> Pipeline {
        let key = |i: usize| {
            plan.buffers[i]
                .key
                .expect("the engine's plan keys every buffer")
        };
        let kept_at = plan_frugal::pp::kept_across(plan);
        let kept = kept_at.iter().map(|&i| arena.id(key(i))).collect();
        let stashed = (plan_frugal::pp::stashed(plan).into_iter())
            .map(|i| arena.id(key(i)))
            .collect();
        let stash = (0..).map_while(|k| arena.try_id(Key::Stash(k))).collect();
        Pipeline {
            stage,
            prev: link(links.prev),
            next: link(links.next),
            group: RefCell::new(comm::Counted::new(links.group)),
            embed: link(links.embed),
            exchange: arena.key_tensor(Key::Work(Work::PpExchange), DType::F32),
            kept,
            stashed,
            stash,
            idle: Cell::new(Duration::ZERO),
            scheduled: Cell::new(Duration::ZERO),
        }
    }

    fn side(&self, side: Side) -> &Link {
        let l = match side {
            Side::Prev => self.prev.as_ref(),
            Side::Next => self.next.as_ref(),
        };
        l.expect("a stage exchanges only with the neighbours it has")
    }

    /// Sends `send` (the boundary tensor, or anything of its size when only receiving) to the
    /// neighbour on `side` while receiving the neighbour's into `work.pp_exchange`.
    pub fn exchange<B: Backend>(
        &self,
        arena: &Arena<B>,
        side: Side,
        send: Tensor,
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        // In f32 both ways (one side may send a bf16 activation while the other sends an f32
        // gradient): this stage's tensor widened into its half, then gathered in place.
        let len = send.len;
        let both = self.exchange.prefix(2 * len);
        let mine = match side {
            Side::Prev => both.slice(len..2 * len),
            Side::Next => both.prefix(len),
        };
        arena.backend().convert(arena, mine, send);
        let op = CommOp::AllGatherInPlace(both);
        let result = arena
            .backend()
            .collective(arena, &mut *self.side(side).borrow_mut(), op);
        self.idle.set(self.idle.get() + started.elapsed());
        Ok(result?)
    }

    /// Copies what the last exchange with `side` received into `dst`.
    pub fn take<B: Backend>(&self, arena: &Arena<B>, side: Side, dst: Tensor) {
        // In a pair's communicator the lower stage is rank 0.
        let half = match side {
            Side::Prev => 0,
            Side::Next => 1,
        };
        let src = self.exchange.slice(half * dst.len..(half + 1) * dst.len);
        arena.backend().convert(arena, dst, src);
    }

    /// `x` from the last stage (the loss, a sampled token) on every stage: a sum over the
    /// pipeline in which only the last stage gives a value.
    pub fn from_last(&self, x: f64) -> Result<f64, EngineError> {
        let mine = if self.stage.is_last() { x } else { 0.0 };
        crate::share::sum_f64(&mut *self.group.borrow_mut(), mine)
    }

    /// A token id chosen on the last stage, on every stage.
    pub fn token_from_last(&self, id: u32) -> Result<u32, EngineError> {
        let root = self.stage.count as usize - 1;
        let mut word = [id as f32];
        (self.group.borrow_mut()).broadcast(BufMut::F32(&mut word), root)?;
        Ok(word[0] as u32)
    }

    /// Sums a tied embedding's gradient `t` (whole fp32) over the first and last stage.
    pub fn sum_embedding<B: Backend>(
        &self,
        arena: &Arena<B>,
        t: Tensor,
    ) -> Result<(), EngineError> {
        if let Some(e) = &self.embed {
            arena
                .backend()
                .collective(arena, &mut *e.borrow_mut(), CommOp::AllReduce(t))?;
        }
        Ok(())
    }

    /// Every stage's whole units (`stage_units`: this stage's, the kinds of `units`) put
    /// together into the whole model's: each unit broadcast from the stage that holds it.
    pub fn gather_units(
        &self,
        share: &Share,
        units: &[Unit],
        stage_units: Vec<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = share.whole.shape.n_layers;
        let mut out: Vec<Vec<f32>> = share
            .whole_units
            .iter()
            .map(|u| vec![0.0; u.padded_numel as usize])
            .collect();
        for (unit, values) in units.iter().zip(stage_units) {
            out[share.whole_index(unit.kind)] = values;
        }
        let mut group = self.group.borrow_mut();
        for (w, unit) in share.whole_units.iter().enumerate() {
            let owner = match unit.kind {
                plan_frugal::units::UnitKind::Embed => 0,
                plan_frugal::units::UnitKind::Head => self.stage.count - 1,
                plan_frugal::units::UnitKind::Block(l) => (0..self.stage.count)
                    .find(|&s| {
                        let st = Stage::of(n, self.stage.count, s);
                        (st.first_layer..st.first_layer + st.layers).contains(&l)
                    })
                    .expect("every layer is on a stage"),
            };
            group.broadcast(BufMut::F32(&mut out[w]), owner as usize)?;
        }
        Ok(out)
    }

    /// Saves the stashed activations of the micro-batch in slot `slot` and parks the buffers
    /// live across the boundary (the next forward reuses them).
    pub fn stash<B: Backend>(&self, arena: &mut Arena<B>, slot: usize) {
        self.copy_stash(arena, slot, true);
        arena.park(&self.kept);
    }

    /// Revives the parked buffers and restores slot `slot`'s activations into them.
    pub fn unstash<B: Backend>(&self, arena: &mut Arena<B>, slot: usize) {
        arena.revive(&self.kept);
        self.copy_stash(arena, slot, false);
    }

    fn copy_stash<B: Backend>(&self, arena: &Arena<B>, slot: usize, save: bool) {
        let stash = arena.tensor(self.stash[slot % self.stash.len()], DType::U8);
        let mut at = 0;
        for &id in &self.stashed {
            let t = arena.tensor(id, DType::U8);
            let part = stash.slice(at..at + t.len);
            match save {
                true => arena.backend().convert(arena, part, t),
                false => arena.backend().convert(arena, t, part),
            }
            at += t.len;
        }
    }
}
