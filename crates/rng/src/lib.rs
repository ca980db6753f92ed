//! The project's one pseudo-random generator: SplitMix64 (Steele, Lea, Flood 2014; the
//! generator `java.util.SplittableRandom` uses and xoshiro's recommended seeder), shared by the
//! data loader's shuffles, synthetic weights (`formats`), weight initialisation (`engine`) and
//! every test and bench. Written out here so a stream is a property of this file, not of a crate
//! version: the same seed gives the same batches and weights on every machine and every release.
//! Distributions (uniform, Gaussian) stay with their users, which fix them for their own outputs.
//!
//! `mutate` holds the byte mutations the parsers' fuzz tests apply.
//!
//! Not for cryptography. Not for statistics that need more than 64 bits of state.
//!
//! ```
//! let mut rng = rng::SplitMix64::new(42);
//! let a = rng.next_u64();
//! assert_eq!(rng::SplitMix64::new(42).next_u64(), a);
//! assert!(rng.next_below(10) < 10);
//! ```

pub mod mutate;

/// SplitMix64: the state advances by the golden-ratio constant; each output is the state passed
/// through a fixed 64-bit mixer.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The state, which `new` takes back to go on from here (a stream handed to another
    /// process).
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The generator for one epoch of a shuffle seeded with `seed`. The epoch goes through the mixer
    /// before it meets the seed, so epochs e and e+1 are unrelated streams, not one stream shifted
    /// by a step (which `new(seed + e * GOLDEN_GAMMA)` would give).
    pub fn for_epoch(seed: u64, epoch: u64) -> Self {
        SplitMix64::new(seed ^ mix64(epoch.wrapping_add(GOLDEN_GAMMA)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A uniform integer in `0..n` without modulo bias: outputs below `2^64 mod n` are rejected
    /// (at most one retry in `2^64 / n`, so almost never). Panics if `n == 0` (a programmer error).
    pub fn next_below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "next_below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let x = self.next_u64();
            if x >= threshold {
                return x % n;
            }
        }
    }

    /// Fisher–Yates shuffle of `items` in place (Durstenfeld's version, from the back).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.next_below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// SplitMix64's output function (Stafford's "Mix13" variant of the MurmurHash3 finaliser).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_splitmix64_outputs() {
        // First outputs for seed 0 of the reference C implementation (splitmix64.c, Vigna).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn shuffle_is_a_permutation_and_epochs_differ() {
        let mut a: Vec<u32> = (0..1000).collect();
        let mut b = a.clone();
        SplitMix64::for_epoch(7, 0).shuffle(&mut a);
        SplitMix64::for_epoch(7, 1).shuffle(&mut b);
        assert_ne!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn next_below_covers_small_ranges_evenly() {
        let mut rng = SplitMix64::new(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[rng.next_below(6) as usize] += 1;
        }
        // Each bucket expects 10000; 5 standard deviations is about ±456.
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }
}
