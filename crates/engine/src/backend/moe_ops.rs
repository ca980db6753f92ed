//! The op descriptors of a mixture-of-experts block (`kernels::moe` holds the layout): the
//! router's softmax and top-k into routing tables, the gathers into expert order and the
//! weighted combine back, and their backwards. The expert GEMMs themselves are plain `Linear`
//! ops on each expert's rows of the sorted layout.
//!
//! Multi-head latent attention's row plumbing (`MlaOp`, `kernels::mla`) lives here too.
//!
//! Example: `MoeOp::Gather { dst: moe_in, src: ln2, route, shape, c }` lays `ln2`'s rows out in
//! expert order.

use super::Tensor;
pub use kernels::mla::Dims as MlaDims;
pub use kernels::moe::{Gating, Routing};

/// Tokens, choices per token and routed experts of one MoE block's pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub n: usize,
    pub k: usize,
    pub experts: usize,
}

impl MoeShape {
    /// Routed rows: N·k.
    pub fn rows(&self) -> usize {
        self.n * self.k
    }
}

/// One MoE bookkeeping op.
#[derive(Clone, Copy, Debug)]
pub enum MoeOp {
    /// `probs` (N, E) holds the router logits: softmax in place, then each row's top-k into
    /// `gates` (N·k) and the routing tables `route` (u32); with `aux` (2E), the selection counts
    /// and probability sums are added to it.
    Route {
        probs: Tensor,
        gates: Tensor,
        route: Tensor,
        shape: MoeShape,
        routing: Routing,
        aux: Option<Tensor>,
    },
    /// `dst` (N·k, C) := `src` (N, C)'s rows in expert order (both f32 or both bf16).
    Gather {
        dst: Tensor,
        src: Tensor,
        route: Tensor,
        shape: MoeShape,
        c: usize,
    },
    /// `out` (N, C) := `residual` + Σ over each token's choices of gate × its row of `y`
    /// (N·k, C, expert order); without `gates` and `residual`, `out` += the plain sum.
    Combine {
        out: Tensor,
        residual: Option<Tensor>,
        y: Tensor,
        gates: Option<Tensor>,
        route: Tensor,
        shape: MoeShape,
        c: usize,
    },
    /// Every expert-order row of `x` (N·k, W) times its gate.
    ScaleRows {
        x: Tensor,
        gates: Tensor,
        route: Tensor,
        shape: MoeShape,
        w: usize,
    },
    /// `dgates` (N·k) += each choice's dot product of its rows of `a` (f32) and `b` (f32 or
    /// bf16), both (N·k, W) in expert order.
    GateGrads {
        dgates: Tensor,
        a: Tensor,
        b: Tensor,
        route: Tensor,
        shape: MoeShape,
        w: usize,
    },
    /// `dlogits` (N, E) += the router's backward from `dgates`, with `dprob` (E) added to every
    /// row's probability gradient (the load-balancing loss).
    RouteBackward {
        dlogits: Tensor,
        dgates: Tensor,
        probs: Tensor,
        route: Tensor,
        shape: MoeShape,
        gating: Gating,
        dprob: Option<Tensor>,
    },
}

/// One multi-head latent attention plumbing op (`kernels::mla`), all tensors f32.
#[derive(Clone, Copy, Debug)]
pub enum MlaOp {
    /// `qkv` (N, 3·H·qk) := queries `q`, keys [k_nope | the RoPE key of `ckv`], padded values.
    Assemble {
        qkv: Tensor,
        q: Tensor,
        kv: Tensor,
        ckv: Tensor,
        n: usize,
        dims: MlaDims,
    },
    /// The backward of `Assemble` into `dq`, `dkv` and the RoPE key columns of `dckv`.
    Disassemble {
        dq: Tensor,
        dkv: Tensor,
        dckv: Tensor,
        dqkv: Tensor,
        n: usize,
        dims: MlaDims,
    },
    /// RoPE on interleaved pairs of the queries' and keys' RoPE columns of fused rows (`inverse`:
    /// the backward).
    Rope {
        qkv: Tensor,
        batch: usize,
        seq: usize,
        dims: MlaDims,
        theta: f32,
        inverse: bool,
    },
    /// `out` (N, H·v) := the values of the kernels' padded output.
    TakeValues {
        out: Tensor,
        padded: Tensor,
        n: usize,
        dims: MlaDims,
    },
    /// `padded` := the values' gradient `dout` in each head's value columns, zero elsewhere.
    PutValues {
        padded: Tensor,
        dout: Tensor,
        n: usize,
        dims: MlaDims,
    },
    /// `latent` (N, rank) := the latent columns of `ckv`; with `back`, `ckv`'s := `latent`.
    Latent {
        latent: Tensor,
        ckv: Tensor,
        n: usize,
        dims: MlaDims,
        back: bool,
    },
}
