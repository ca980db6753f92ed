//! [`Real`]: the few float operations the reference kernels need, for f32 and f64.
//!
//! The reference loops are written once over `F: Real`; in f32 they are held against the fast
//! kernels, in f64 against central finite differences. This is not a general numeric trait (no
//! num-traits dependency): only what the kernels here call.
//!
//! ```
//! use linalg::Real;
//! fn half<F: Real>(x: F) -> F { x * F::from_f64(0.5) }
//! assert_eq!(half(3.0f64), 1.5);
//! ```

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A float type the reference kernels can run in.
pub trait Real:
    Copy
    + PartialOrd
    + std::fmt::Debug
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn sqrt(self) -> Self;
    fn cos(self) -> Self;
    fn sin(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn neg_infinity() -> Self;
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            fn neg_infinity() -> Self {
                <$t>::NEG_INFINITY
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);
