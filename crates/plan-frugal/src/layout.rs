//! Offsets of a plan's buffers inside one slab per device, assigned from their lifetimes.
//!
//! Two buffers may share bytes only if their lifetimes do not overlap. Buffers are placed in order
//! of birth (longer-lived first among equals), each at the lowest offset free of every placed buffer
//! it overlaps in time. For the engine's plans (nested forward/backward lifetimes plus the
//! backward's gradient scratch) this packs the slab to exactly the plan's peak, which a test checks;
//! where it cannot, `slab_bytes` says honestly how much more the arena reserves.
//!
//! Example: buffers a (Forward(0)..Backward(0)) and b (Backward(1)..Backward(1)) of a 2-layer plan
//! overlap in time and get disjoint offsets; c (EmbedBackward) may reuse a's bytes.

use plan::buffer::{Device, Lifetime, MemoryPlan};

/// Byte offset of every buffer of one device, and the slab size that holds them.
#[derive(Clone, Debug, PartialEq)]
pub struct SlabLayout {
    pub device: Device,
    /// `(index into plan.buffers, offset in bytes)` for every buffer on `device`.
    pub offsets: Vec<(usize, u64)>,
    pub slab_bytes: u64,
}

/// The CPU engine's alignment: offsets are multiples of this (buffers hold f32, u32 or bf16,
/// 2-byte buffers round up). A device backend names its own (`assign_offsets_aligned`).
pub const ALIGN_BYTES: u64 = 4;

fn interval(plan: &MemoryPlan, lifetime: Lifetime) -> (u32, u32) {
    match lifetime {
        Lifetime::Persistent => (0, u32::MAX),
        Lifetime::Span { born, dies } => (born.ordinal(plan.n_layers), dies.ordinal(plan.n_layers)),
    }
}

/// Places every buffer of `device` in one slab: first fit in two orders (by birth, and largest
/// first), keeping the smaller slab. Birth order packs the nested forward/backward lifetimes
/// exactly; largest-first packs ZeRO-3's chains of overlapping gathers where birth order leaves
/// gaps. Both are deterministic, so the engine and the plan always agree on the offsets.
pub fn assign_offsets(plan: &MemoryPlan, device: Device) -> SlabLayout {
    assign_offsets_aligned(plan, device, ALIGN_BYTES)
}

/// [`assign_offsets`] with every offset a multiple of `align` bytes (a power of two).
pub fn assign_offsets_aligned(plan: &MemoryPlan, device: Device, align: u64) -> SlabLayout {
    assert!(
        align.is_power_of_two(),
        "alignment {align} is a power of two"
    );
    let order: Vec<usize> = (0..plan.buffers.len())
        .filter(|&i| plan.buffers[i].device == device)
        .collect();
    let span = |i: usize| interval(plan, plan.buffers[i].lifetime);
    let persistent = |i: usize| plan.buffers[i].lifetime == Lifetime::Persistent;
    let mut by_birth = order.clone();
    by_birth.sort_by_key(|&i| {
        let (born, dies) = span(i);
        let bytes = plan.buffers[i].bytes;
        (!persistent(i), born, u32::MAX - dies, u64::MAX - bytes)
    });
    let first = first_fit(plan, device, &by_birth, align);
    let gathers = |b: &plan::buffer::Buffer| {
        use super::key::Key;
        matches!(
            b.key,
            Some(
                Key::GatherFwd(_)
                    | Key::GatherBwd(_)
                    | Key::GatherHeadEmbed
                    | Key::VectorsFwd(_)
                    | Key::VectorsBwd(_)
            )
        )
    };
    if !plan.buffers.iter().any(gathers) {
        return first;
    }
    let mut by_size = order;
    by_size.sort_by_key(|&i| {
        let (born, _) = span(i);
        (!persistent(i), u64::MAX - plan.buffers[i].bytes, born)
    });
    let second = first_fit(plan, device, &by_size, align);
    if second.slab_bytes < first.slab_bytes {
        second
    } else {
        first
    }
}

/// Places the buffers in `order`, each at the lowest offset free of every placed buffer it
/// overlaps in time.
fn first_fit(plan: &MemoryPlan, device: Device, order: &[usize], align: u64) -> SlabLayout {
    let span = |i: usize| interval(plan, plan.buffers[i].lifetime);
    let mut placed: Vec<(usize, u64)> = Vec::with_capacity(order.len());
    let mut slab_bytes = 0;
    for &i in order {
        let bytes = plan.buffers[i].bytes.next_multiple_of(align);
        let (born, dies) = span(i);
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(j, _)| {
                let (b2, d2) = span(j);
                born <= d2 && b2 <= dies
            })
            .map(|&(j, off)| (off, off + plan.buffers[j].bytes.next_multiple_of(align)))
            .collect();
        busy.sort_unstable();
        let mut offset = 0;
        for (start, end) in busy {
            if offset + bytes <= start {
                break;
            }
            offset = offset.max(end);
        }
        slab_bytes = slab_bytes.max(offset + bytes);
        placed.push((i, offset));
    }
    placed.sort_unstable();
    SlabLayout {
        device,
        offsets: placed,
        slab_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::buffer::{Buffer, Category, Phase};

    fn buf(bytes: u64, lifetime: Lifetime) -> Buffer {
        Buffer::named(
            format!("b{bytes}"),
            Category::Activations,
            Device::Gpu,
            bytes,
            lifetime,
        )
    }

    #[test]
    fn overlapping_lifetimes_never_share_bytes_and_dead_ones_do() {
        let span = |born, dies| Lifetime::Span { born, dies };
        let mut plan = MemoryPlan::new(2);
        plan.push(buf(100, Lifetime::Persistent));
        plan.push(buf(8, span(Phase::Forward(0), Phase::Backward(0))));
        plan.push(buf(12, span(Phase::Backward(1), Phase::Backward(1))));
        plan.push(buf(16, span(Phase::EmbedBackward, Phase::Optimizer)));
        let layout = assign_offsets(&plan, Device::Gpu);
        assert_eq!(layout.offsets, vec![(0, 0), (1, 100), (2, 108), (3, 100)]);
        assert_eq!(layout.slab_bytes, 120);
        assert_eq!(layout.slab_bytes, plan.peak_bytes(Device::Gpu));
    }
}
