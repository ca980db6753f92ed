//! Error metrics of a quantization round trip: max absolute error, RMSE and SQNR in dB.
//!
//! SQNR = 10·log10(Σx² / Σ(x - x̂)²); it is `None` when the round trip is exact (infinite SQNR)
//! or the signal is all zeros. Statistics merge, so a file's total is exact over all its tensors.
//! Example: `ErrorStats::of(&[1.0, 2.0], &[1.0, 2.5]).metrics().max_abs` is `0.5`.

use serde::Serialize;

/// Running sums over (original, reconstructed) pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    pub n: u64,
    pub signal_sq_sum: f64,
    pub error_sq_sum: f64,
    pub max_abs: f64,
}

/// Summary of a round trip's error.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ErrorMetrics {
    pub n: u64,
    pub max_abs: f64,
    pub rmse: f64,
    pub sqnr_db: Option<f64>,
}

impl ErrorStats {
    /// Statistics of one tensor; the two slices must have the same length.
    pub fn of(original: &[f32], reconstructed: &[f32]) -> ErrorStats {
        assert_eq!(
            original.len(),
            reconstructed.len(),
            "one reconstruction per value"
        );
        let mut stats = ErrorStats::default();
        for (&x, &y) in original.iter().zip(reconstructed) {
            let (x, y) = (x as f64, y as f64);
            let err = (x - y).abs();
            stats.n += 1;
            stats.signal_sq_sum += x * x;
            stats.error_sq_sum += err * err;
            stats.max_abs = stats.max_abs.max(err);
        }
        stats
    }

    pub fn merge(&mut self, other: &ErrorStats) {
        self.n += other.n;
        self.signal_sq_sum += other.signal_sq_sum;
        self.error_sq_sum += other.error_sq_sum;
        self.max_abs = self.max_abs.max(other.max_abs);
    }

    pub fn metrics(&self) -> ErrorMetrics {
        let rmse = if self.n == 0 {
            0.0
        } else {
            (self.error_sq_sum / self.n as f64).sqrt()
        };
        let sqnr_db = (self.error_sq_sum > 0.0 && self.signal_sq_sum > 0.0)
            .then(|| 10.0 * (self.signal_sq_sum / self.error_sq_sum).log10());
        ErrorMetrics {
            n: self.n,
            max_abs: self.max_abs,
            rmse,
            sqnr_db,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_of_a_known_error() {
        let m = ErrorStats::of(&[3.0, 4.0], &[3.0, 4.5]).metrics();
        assert_eq!(m.max_abs, 0.5);
        assert_eq!(m.rmse, (0.125f64).sqrt());
        // Σx² = 25, Σe² = 0.25 → 10·log10(100) = 20 dB.
        assert!((m.sqnr_db.unwrap() - 20.0).abs() < 1e-12);
        assert_eq!(ErrorStats::of(&[1.0], &[1.0]).metrics().sqnr_db, None);
    }
}
