//! The names of a model's parameter tensors ([`Role`]), of the parts of a model that hold them
//! ([`UnitKind`]), and sets of matrix roles ([`Roles`]): the vocabulary a plan's buffer keys and
//! the serving plan's storage formats share.
//!
//! Example: `Roles::NONE.with(Role::QkvWeight).has(Role::QkvWeight)` is true.

/// What a parameter tensor is for, as the engine's kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Token embedding (V, C); also the output projection when tied.
    TokenEmbedding,
    /// Learned positions (maxT, C), GPT-2 only.
    PositionEmbedding,
    Norm1Weight,
    Norm1Bias,
    /// Fused q|k|v projection ((NH + 2 NKV) HD, C).
    QkvWeight,
    QkvBias,
    /// Attention output projection (C, NH HD).
    AttnProjWeight,
    AttnProjBias,
    Norm2Weight,
    Norm2Bias,
    /// MLP up projection: (4C, C) for GPT-2, fused gate|up (2F, C) for Llama.
    FcWeight,
    FcBias,
    /// MLP down projection (C, F).
    FcProjWeight,
    FcProjBias,
    FinalNormWeight,
    FinalNormBias,
    /// Untied output projection (V, C).
    LmHead,
    /// Mixture of experts: the router (E, C).
    RouterWeight,
    /// Every expert's fused gate|up projection, expert after expert (E·2F, C).
    ExpertsFcWeight,
    /// Every expert's down projection, expert after expert (E·C, F).
    ExpertsProjWeight,
    /// The shared experts' fused gate|up (2S, C) and down (C, S) projections (DeepSeek).
    SharedFcWeight,
    SharedProjWeight,
    /// Multi-head latent attention: the direct query projection (NH·(nope + rope), C), or the
    /// query bottleneck (q_rank, C), its norm (q_rank) and expansion (NH·(nope + rope), q_rank).
    MlaQ,
    MlaQa,
    MlaQaNorm,
    MlaQb,
    /// The latent with the shared RoPE key (kv_rank + rope, C), the latent's norm (kv_rank)
    /// and its key/value expansion (NH·(nope + v), kv_rank).
    MlaKva,
    MlaKvNorm,
    MlaKvb,
    /// LoRA: the `i`-th adapted HF linear of a block, its down projection A (r, IC).
    LoraA(u8),
    /// Its up projection B (rows, r).
    LoraB(u8),
}

/// Which part of the model a unit holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitKind {
    Embed,
    Block(u32),
    Head,
}

/// Whether a unit's view is stored in the weight format (a matrix) or in fp32 (a vector).
pub fn is_matrix(role: Role) -> bool {
    MATRIX_ROLES.contains(&role)
}

/// A set of matrix roles (those [`is_matrix`] names); `--json` lists their names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Roles(u32);

impl serde::Serialize for Roles {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let names: Vec<String> = MATRIX_ROLES
            .iter()
            .filter(|&&r| self.has(r))
            .map(|r| format!("{r:?}"))
            .collect();
        names.serialize(s)
    }
}

/// The matrix roles (stored in the weight format), in the order of their bits.
pub const MATRIX_ROLES: [Role; 14] = [
    Role::TokenEmbedding,
    Role::QkvWeight,
    Role::AttnProjWeight,
    Role::FcWeight,
    Role::FcProjWeight,
    Role::LmHead,
    Role::ExpertsFcWeight,
    Role::ExpertsProjWeight,
    Role::SharedFcWeight,
    Role::SharedProjWeight,
    Role::MlaQ,
    Role::MlaQa,
    Role::MlaQb,
    Role::MlaKva,
];

impl Roles {
    pub const NONE: Roles = Roles(0);
    pub const ALL: Roles = Roles((1 << MATRIX_ROLES.len()) - 1);

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    fn bit(role: Role) -> u32 {
        MATRIX_ROLES
            .iter()
            .position(|&r| r == role)
            .map_or(0, |i| 1 << i)
    }

    /// Whether `role` is in the set (never, for a role that is not a matrix).
    pub fn has(self, role: Role) -> bool {
        self.0 & Roles::bit(role) != 0
    }

    /// The set with `role` added.
    pub fn with(self, role: Role) -> Roles {
        Roles(self.0 | Roles::bit(role))
    }

    /// The roles of this set that are not in `other`.
    pub fn difference(self, other: Roles) -> Roles {
        Roles(self.0 & !other.0)
    }
}
