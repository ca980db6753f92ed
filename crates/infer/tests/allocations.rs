//! "Nothing is allocated inside a step", for decoding: a counting global allocator records every
//! heap allocation made while `Worker::decode` runs (after warm-up), at every weight format and
//! every instruction-set level this CPU runs (`kernels::cpu`).

use engine::testkit::{count_allocations, llama_tiny, tokens, Capped, Counting};
use infer::Worker;
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The inference engine's decode steps, after warm-up: host metadata (positions, cache slots,
/// block-table views, a few dozen bytes a row) and rayon's job queues (blocks of 1,520 bytes),
/// never a block as large as one of the step's tensors (8 rows of q|k|v: 2 KiB).
#[test]
fn a_decode_step_allocates_no_tensor() {
    let shape = llama_tiny();
    let model = engine::ModelConfig::from_shape(shape.clone()).unwrap();
    let formats = [
        WeightFormat::F32,
        WeightFormat::Int8,
        WeightFormat::Int4 {
            group: 32,
            asym: false,
        },
        WeightFormat::Nf4 { group: 32 },
    ];
    for (w, level) in formats
        .iter()
        .flat_map(|&w| kernels::cpu::supported().into_iter().map(move |l| (w, l)))
    {
        let _capped = Capped::at(level);
        let setup = ServeSetup::generation(&shape, 8, 32, w, KvFormat::Int8, 4, 4);
        let mut s = Worker::new(model.clone(), setup).unwrap();
        s.fill_random(1);
        // The decode step's q|k|v rows: a tensor of the step (its norm statistics are smaller
        // than a host metadata vector at this toy size).
        let key = plan_frugal::Key::Step(plan_frugal::StepKind::Decode, plan_frugal::StepAct::Qkv);
        let smallest = s
            .plan
            .buffers
            .iter()
            .find(|b| b.key == Some(key))
            .unwrap()
            .bytes;
        let seqs: Vec<_> = (0..8).map(|_| s.new_sequence()).collect();
        let mut logits = Vec::new();
        for &q in &seqs {
            s.prefill(q, &tokens(5, 96, 3), &mut logits).unwrap();
        }
        // Warm-up: every rayon thread's kernel scratch grows to the step's sizes (and, where
        // products nest on a thread, to as many as nest).
        for _ in 0..6 {
            s.decode(&seqs, &[1, 2, 3, 4, 5, 6, 7, 8], &mut logits)
                .unwrap();
        }
        let (_, bytes, largest) = count_allocations(|| {
            for _ in 0..4 {
                s.decode(&seqs, &[9, 10, 11, 12, 13, 14, 15, 16], &mut logits)
                    .unwrap();
            }
        });
        assert!(
            largest < smallest,
            "{w:?} at {level}: an allocation of {largest} bytes, the smallest activation is {smallest}"
        );
        assert!(bytes < 4 * 64 * 1024, "{w:?} at {level}: bytes per 4 steps");
    }
}
