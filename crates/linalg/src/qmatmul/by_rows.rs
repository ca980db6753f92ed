//! The per-row-count dispatch every quantized SIMD path shares (a macro: its kernels are
//! generic over the row count, so accumulators stay in registers).

/// `f::<R>(args)` for the activation-row count `rows` (1..=8): each path's kernel is
/// compiled per row count, so its accumulators stay in registers.
macro_rules! by_rows {
    ($rows:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $rows {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            4 => $f::<4>($($arg),*),
            5 => $f::<5>($($arg),*),
            6 => $f::<6>($($arg),*),
            7 => $f::<7>($($arg),*),
            _ => $f::<8>($($arg),*),
        }
    };
}
