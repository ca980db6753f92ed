//! The tensors a transformer block saves for its backward (`BlockTensor`): their names, which
//! are stored as bf16 under `--precision bf16` and which `keep-matmuls` recomputes. Their element
//! counts for a block's dimensions are the `frugal` runtime's (`BlockDims::numel`).
//!
//! Example: `BlockTensor::Qkv.suffix()` is `"qkv"`.

/// The tensors a block's backward reads, besides its input and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockTensor {
    Ln1,
    Ln1Mean,
    Ln1Rstd,
    Qkv,
    /// Attention probabilities (materialised attention only).
    Att,
    /// Log-sum-exp per row (flash attention only).
    Lse,
    Atty,
    Res2,
    Ln2,
    Ln2Mean,
    Ln2Rstd,
    Fch,
    FchAct,
    /// Mixture of experts: the router's probabilities (N, E).
    Probs,
    /// The routing tables (u32): each token's experts, the expert-order permutation, its
    /// inverse and the experts' row offsets.
    Route,
    /// Each choice's gate (N·k).
    Gates,
    /// Multi-head latent attention: the query bottleneck `q_a_proj`'s output (N, q_rank), its
    /// norm and reciprocal std (with `q_lora_rank` only).
    Qa,
    QaNorm,
    QaRstd,
    /// The key/value latent (N, kv_rank), its norm and reciprocal std.
    KvLatent,
    KvNorm,
    KvRstd,
    /// The attention kernel's output with each head's value padded to nope + rope (the
    /// projection reads `atty`, the values alone).
    AttyPad,
    /// The shared experts' MLP (DeepSeek): its gate|up output (N, 2S) and activation (N, S).
    SharedFch,
    SharedFchAct,
}

impl BlockTensor {
    /// In the order the forward pass writes them.
    pub const ALL: [BlockTensor; 25] = [
        BlockTensor::Ln1,
        BlockTensor::Ln1Mean,
        BlockTensor::Ln1Rstd,
        BlockTensor::Qa,
        BlockTensor::QaNorm,
        BlockTensor::QaRstd,
        BlockTensor::KvLatent,
        BlockTensor::KvNorm,
        BlockTensor::KvRstd,
        BlockTensor::Qkv,
        BlockTensor::Att,
        BlockTensor::Lse,
        BlockTensor::AttyPad,
        BlockTensor::Atty,
        BlockTensor::Res2,
        BlockTensor::Ln2,
        BlockTensor::Ln2Mean,
        BlockTensor::Ln2Rstd,
        BlockTensor::Probs,
        BlockTensor::Route,
        BlockTensor::Gates,
        BlockTensor::Fch,
        BlockTensor::FchAct,
        BlockTensor::SharedFch,
        BlockTensor::SharedFchAct,
    ];

    /// The name's last part: `act.h.3.<suffix>`.
    pub fn suffix(self) -> &'static str {
        match self {
            BlockTensor::Ln1 => "ln1",
            BlockTensor::Ln1Mean => "ln1_mean",
            BlockTensor::Ln1Rstd => "ln1_rstd",
            BlockTensor::Qkv => "qkv",
            BlockTensor::Att => "att",
            BlockTensor::Lse => "lse",
            BlockTensor::Atty => "atty",
            BlockTensor::Res2 => "res2",
            BlockTensor::Ln2 => "ln2",
            BlockTensor::Ln2Mean => "ln2_mean",
            BlockTensor::Ln2Rstd => "ln2_rstd",
            BlockTensor::Fch => "fch",
            BlockTensor::FchAct => "fch_act",
            BlockTensor::Probs => "probs",
            BlockTensor::Route => "route",
            BlockTensor::Gates => "gates",
            BlockTensor::Qa => "q_a",
            BlockTensor::QaNorm => "q_a_norm",
            BlockTensor::QaRstd => "q_a_rstd",
            BlockTensor::KvLatent => "kv_latent",
            BlockTensor::KvNorm => "kv_norm",
            BlockTensor::KvRstd => "kv_rstd",
            BlockTensor::AttyPad => "atty_pad",
            BlockTensor::SharedFch => "shared_fch",
            BlockTensor::SharedFchAct => "shared_fch_act",
        }
    }

    /// Whether a matmul reads this tensor (stored as bf16 under `--precision bf16`); norms'
    /// statistics, matmul outputs and attention's `att`/`lse` stay f32, as under torch autocast.
    /// Latent attention's normed latents feed `q_b_proj` and `kv_b_proj`.
    pub fn is_matmul_input(self) -> bool {
        matches!(
            self,
            BlockTensor::Ln1
                | BlockTensor::Atty
                | BlockTensor::Ln2
                | BlockTensor::FchAct
                | BlockTensor::SharedFchAct
                | BlockTensor::QaNorm
                | BlockTensor::KvNorm
        )
    }

    /// Whether this tensor is a matmul's output that the backward re-reads (`qkv` by attention,
    /// `fch` by the activation): stored as bf16 under `--precision bf16`. `res2`, the residual
    /// stream, is a matmul output too, saved in bf16 by `ActPolicy::elem_bytes`.
    pub fn is_matmul_output(self) -> bool {
        matches!(
            self,
            BlockTensor::Qkv | BlockTensor::Fch | BlockTensor::SharedFch
        )
    }

    /// `keep-matmuls` keeps the matmul outputs and recomputes everything cheap from them: the
    /// norms (from the block input and `res2`), the attention core (from `qkv`) and the
    /// activation. The router's outputs are kept with them (the routing decides which rows
    /// `fch` holds).
    pub fn keep_matmuls_recomputes(self) -> bool {
        !matches!(
            self,
            BlockTensor::Qkv
                | BlockTensor::Res2
                | BlockTensor::Fch
                | BlockTensor::Probs
                | BlockTensor::Route
                | BlockTensor::Gates
                | BlockTensor::SharedFch
                | BlockTensor::Qa
                | BlockTensor::QaNorm
                | BlockTensor::QaRstd
                | BlockTensor::KvLatent
                | BlockTensor::KvNorm
                | BlockTensor::KvRstd
        )
    }
}
