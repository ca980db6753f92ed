//! `Solo`: the world of one rank. Every collective is a local copy (or nothing), with the same
//! argument checks as a real world, so the engine speaks to one rank exactly as to many and has
//! no `Option<communicator>` branches.
//!
//! ```
//! use comm::{Collective, Solo};
//! let mut c = Solo::new();
//! let mut out = [0.0f32; 2];
//! c.all_gather([1.0f32, 2.0].as_slice().into(), out.as_mut_slice().into()).unwrap();
//! assert_eq!((out, c.world_size()), ([1.0, 2.0], 1));
//! ```

use crate::{Buf, BufMut, Collective, CommError, ReduceOp, Result};

/// The one rank of a world of one.
#[derive(Debug, Default)]
pub struct Solo {
    aborted: std::sync::Mutex<Option<String>>,
}

impl Solo {
    pub fn new() -> Solo {
        Solo::default()
    }

    fn check(&self) -> Result<()> {
        let aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        match aborted.as_ref() {
            Some(reason) => Err(CommError::Aborted {
                rank: 0,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn copy(&self, op: &'static str, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        self.check()?;
        let bad = |detail: String| CommError::BadArgs {
            rank: 0,
            op,
            detail,
        };
        if input.len() != output.len() {
            return Err(bad(format!(
                "input has {} elements and output {}; in a world of one they are equal",
                input.len(),
                output.len()
            )));
        }
        match (input, output) {
            (Buf::F32(i), BufMut::F32(o)) => o.copy_from_slice(i),
            (Buf::Bf16(i), BufMut::Bf16(o)) => o.copy_from_slice(i),
            (i, o) => {
                return Err(bad(format!(
                    "input is {} but output is {}; both must have the same element type",
                    i.dtype().name(),
                    o.dtype().name()
                )))
            }
        }
        Ok(())
    }
}

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    /// The sum, mean or maximum over one rank is the value itself.
    fn all_reduce(&mut self, _buf: BufMut<'_>, _op: ReduceOp) -> Result<()> {
        self.check()
    }

    fn reduce_scatter(&mut self, input: Buf<'_>, output: BufMut<'_>, _op: ReduceOp) -> Result<()> {
        self.copy("reduce_scatter", input, output)
    }

    fn all_gather(&mut self, input: Buf<'_>, output: BufMut<'_>) -> Result<()> {
        self.copy("all_gather", input, output)
    }

    fn reduce_scatter_in_place(&mut self, _buf: BufMut<'_>, _op: ReduceOp) -> Result<()> {
        self.check()
    }

    fn all_gather_in_place(&mut self, _buf: BufMut<'_>) -> Result<()> {
        self.check()
    }

    fn broadcast(&mut self, _buf: BufMut<'_>, root: usize) -> Result<()> {
        self.check()?;
        if root != 0 {
            return Err(CommError::BadArgs {
                rank: 0,
                op: "broadcast",
                detail: format!("root {root} is not a rank of this world of 1 (ranks are 0..1)"),
            });
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.check()
    }

    fn abort(&self, reason: &str) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        aborted.get_or_insert_with(|| reason.to_string());
    }

    fn split(&mut self, _color: u32, _key: u32) -> Result<Box<dyn Collective>> {
        self.check()?;
        Ok(Box::new(Solo::new()))
    }
}
