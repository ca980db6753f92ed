//! The arena's lifetime and borrow checks, on the CPU backend.

use cpu::{Cpu, Views};
use engine::arena::Arena;
use engine::backend::{DType, Tensor};
use plan::buffer::Buffer;
use plan::buffer::{Category, Device, Lifetime, MemoryPlan, Phase};
use plan_frugal::Key;
use plan_frugal::UnitKind;

fn plan() -> MemoryPlan {
    let mut plan = MemoryPlan::new(1);
    let buf =
        |key: Key, lifetime| Buffer::keyed(key, Category::Activations, Device::Gpu, 16, lifetime);
    plan.push(buf(Key::Params(UnitKind::Embed), Lifetime::Persistent));
    let span = Lifetime::Span {
        born: Phase::Forward(0),
        dies: Phase::Backward(0),
    };
    plan.push(buf(Key::Encoded, span));
    plan
}

fn arena() -> Arena<Cpu> {
    Arena::new(Cpu::new(), &plan(), Device::Gpu, None).unwrap()
}

#[test]
#[should_panic(expected = "used outside its planned lifetime")]
fn a_buffer_used_before_it_is_born_panics() {
    let arena = arena();
    let _ = arena.f32(arena.id(Key::Encoded));
}

#[test]
#[should_panic(expected = "already borrowed")]
fn a_buffer_borrowed_twice_mutably_panics() {
    let arena = arena();
    let id = arena.id(Key::Params(UnitKind::Embed));
    let _a = arena.f32_mut(id);
    let _b = arena.f32_mut(id);
}

#[test]
#[should_panic(expected = "beyond buffer")]
fn a_tensor_past_its_buffer_panics() {
    let arena = arena();
    let t = arena.key_tensor(Key::Params(UnitKind::Embed), DType::F32);
    let _ = arena.view::<f32>(Tensor {
        len: t.len + 1,
        ..t
    });
}

#[test]
fn live_bytes_follow_the_phases() {
    let mut arena = arena();
    let act = Category::Activations as usize;
    assert_eq!(arena.live_bytes()[act], 16);
    arena.enter(Phase::Forward(0));
    assert_eq!(arena.live_bytes()[act], 32);
    arena.f32_mut(arena.id(Key::Encoded)).fill(1.0);
    arena.leave(Phase::Forward(0));
    arena.enter(Phase::Backward(0));
    arena.leave(Phase::Backward(0));
    assert_eq!(arena.live_bytes()[act], 16);
    assert_eq!(arena.measured().peak_bytes, 32);
}
