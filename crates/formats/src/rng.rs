//! A small seeded random number generator (the `rng` crate's SplitMix64) with uniform and
//! Gaussian draws, for
//! reproducible synthetic weights (`frugal formats --random N`) and tests.
//!
//! Not cryptographic, and not meant to match any other library's stream. Example:
//! `let mut rng = Rng::new(42); let x = rng.gaussian();` gives the same `x` on every machine.

/// The project's SplitMix64 stream with uniform and Gaussian draws on top.
#[derive(Clone, Debug)]
pub struct Rng {
    core: rng::SplitMix64,
    /// The second Box-Muller value, kept for the next call.
    spare: Option<f64>,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            core: rng::SplitMix64::new(seed),
            spare: None,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.core.next_u64()
    }

    /// Uniform in (0, 1): 53 random bits, offset by half a step so 0 never comes out.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal draw (Box-Muller transform).
    pub fn gaussian(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let radius = (-2.0 * self.uniform().ln()).sqrt();
        let angle = std::f64::consts::TAU * self.uniform();
        self.spare = Some(radius * angle.sin());
        radius * angle.cos()
    }

    /// `n` standard normal draws times `std`, as f32.
    pub fn gaussian_vec(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.gaussian() * std) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_moments_are_close_to_standard() {
        let mut rng = Rng::new(7);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| rng.gaussian()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors: mean 1/sqrt(n) ≈ 0.0022, variance sqrt(2/n) ≈ 0.0032; allow ~5 sigma.
        assert!(mean.abs() < 0.012, "mean {mean}");
        assert!((var - 1.0).abs() < 0.016, "variance {var}");
    }

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        assert_eq!(a.gaussian_vec(10, 1.0), b.gaussian_vec(10, 1.0));
        assert_ne!(Rng::new(4).next_u64(), Rng::new(3).next_u64());
    }
}
