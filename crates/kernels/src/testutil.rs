//! Test helpers: `linalg`'s (a seeded generator, finite differences, loud comparisons), and two
//! thread ranks for the vocab-parallel classifiers.

pub use linalg::testutil::*;

/// Two ranks as threads meeting in a row reduction (the vocab-parallel classifiers'): each posts
/// its buffer, waits for the other, and takes the element-wise max or sum of both.
pub struct TwoRanks {
    barrier: std::sync::Barrier,
    slots: std::sync::Mutex<[Vec<f32>; 2]>,
}

impl TwoRanks {
    pub fn new() -> TwoRanks {
        TwoRanks {
            barrier: std::sync::Barrier::new(2),
            slots: Default::default(),
        }
    }

    pub fn reduce(&self, rank: usize, buf: &mut [f32], op: crate::classifier::shard::RowReduce) {
        use crate::classifier::shard::RowReduce;
        self.slots.lock().unwrap()[rank] = buf.to_vec();
        self.barrier.wait();
        let all = self.slots.lock().unwrap().clone();
        for (i, x) in buf.iter_mut().enumerate() {
            *x = match op {
                RowReduce::Max => all[0][i].max(all[1][i]),
                RowReduce::Sum => all[0][i] + all[1][i],
            };
        }
        self.barrier.wait();
    }
}
