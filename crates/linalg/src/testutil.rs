//! Test helpers: a seeded generator, central finite differences in f64, and loud comparisons.
//!
//! Every backward test builds a scalar loss `L = sum(out * r)` with random `r` (so `dout = r`),
//! differentiates it numerically in f64 through the reference forward, and compares both the f64
//! reference backward (tight budget) and the f32 fast backward (f32 budget) against it.

/// Step for central differences. In f64 the truncation error is O(h^2) ~ 1e-10 and the rounding
/// error O(eps * |L| / h) ~ 1e-11 for the O(1) losses used here, both far under the budgets below.
pub const FD_STEP: f64 = 1e-5;

/// f64 reference backward vs f64 finite differences: both sides are exact to ~1e-9, so anything
/// above 1e-6 is a wrong formula, not rounding.
pub const FD_TOL_F64: f64 = 1e-6;

/// f32 fast kernel vs f64 oracle: f32 has ~6e-8 relative precision and the small reductions here
/// (a few hundred terms) lose at most a few ulps per term, so 2e-4 relative-or-absolute leaves
/// margin without hiding a wrong index (which shows as O(1) errors).
pub const F32_TOL: f64 = 2e-4;

/// The project's SplitMix64 with the tests' draws on top.
pub struct Rng(rng::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(rng::SplitMix64::new(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.uniform()).collect()
    }
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % n as u64) as u32
    }
}

pub fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central-difference gradient of `loss` at `x`.
pub fn fd_grad(x: &[f64], loss: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            xp[i] = x[i] + FD_STEP;
            let up = loss(&xp);
            xp[i] = x[i] - FD_STEP;
            let down = loss(&xp);
            xp[i] = x[i];
            (up - down) / (2.0 * FD_STEP)
        })
        .collect()
}

/// Panics with the first offending index unless `|got - want| <= tol * max(1, |want|)` everywhere.
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length {} vs {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let budget = tol * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= budget && g.is_finite(),
            "{what}[{i}]: got {g}, want {w}, |diff| {} > budget {budget}",
            (g - w).abs()
        );
    }
}

/// As [`assert_close`] for f32 results.
#[track_caller]
pub fn assert_close_f32(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_close(what, &to_f64(got), want, tol);
}
