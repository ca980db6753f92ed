//! Shapes the planner's integration tests share.

#![allow(dead_code)]

/// Llama-2-7B's seven linear layers per block as (in, out): q, k, v, o, gate, up, down.
pub const L2_LINEARS: [(u64, u64); 7] = [
    (4096, 4096),
    (4096, 4096),
    (4096, 4096),
    (4096, 4096),
    (4096, 11008),
    (4096, 11008),
    (11008, 4096),
];
