//! LoRA/QLoRA in the `frugal` runtime: the frozen base, the adapter units and the buffers that
//! only a LoRA step has.
//!
//! The base is frozen, so it has no gradient and no optimizer state. Its embedding, norms,
//! biases and head stay fp32 in `base.<u>` (the model's units without the four block matrices);
//! each block matrix (q|k|v, attention projection, fc, fc projection) is `base.h.<l>.<role>` in
//! the base format, one HF linear after another (bitsandbytes quantizes each `nn.Linear` on its
//! own): fp32, bf16, int8 (one fp32 absmax scale per output row), NF4 exactly as bitsandbytes
//! stores it (blocks of 64, fp32 absmax, or with double quantization, `formats::bnb`), or a GGUF
//! file's own blocks as inference's `ggml` weights hold them ([`GgmlBase`]). Each part
//! is padded to 4 bytes. A GEMM dequantizes one tile of [`DEQUANT_TILE_ROWS`] rows of a part at a
//! time into `work.dequant` (one tile's f32 size; none for an fp32 base) and multiplies it, in the
//! forward and again in the backward, so no dequantized copy outlives its tile's GEMM.
//!
//! The trainable parameters are the adapters: one unit per block (kind `Block(l)`, so ZeRO, the
//! optimizer and snapshots treat them as any unit), holding for every adapted linear A (r, IC)
//! then B (rows, r) of each targeted HF part, the A's of one fused view side by side so that
//! u = x·Aᵀ is one GEMM (N, r·parts). Views carry PEFT's tensor names
//! (`base_model.model.<module>.lora_A.weight`). `act.h.<l>.lora_u.<role>` keeps u for B's
//! gradient with the lifetime of the block's matmul outputs (recomputed with them);
//! `work.lora_du` holds du in the backward.
//!
//! Example: llama-tiny with rank 8 on q_proj,v_proj has per block the views `lora_a.0`
//! (q, 8 × C), `lora_a.1` (v), `lora_b.0`, `lora_b.1`, and the site of `qkv_w` with two parts.

use super::acts::{ActPolicy, BlockDims, BlockTensor};
use super::key::{Key, Work};
use super::units::{param_units, Role, Unit, UnitBuilder, UnitKind};
use plan::buffer::{Buffer, Category, Device, Lifetime, Phase};
use plan::setup::{Dtype, Lora};
use plan::{ModelShape, PlanError};

/// The block matrices, in the order a block runs them.
pub const MATRICES: [Role; 4] = [
    Role::QkvWeight,
    Role::AttnProjWeight,
    Role::FcWeight,
    Role::FcProjWeight,
];

/// NF4's block size (bitsandbytes' QLoRA default).
pub const NF4_BLOCK: u64 = 64;

/// Rows of a frozen part dequantized at a time: the GEMM that reads the tile finds it in the last-level cache
/// (1024 × 4096 f32 is 16 MiB), and `work.dequant` holds one tile, not one matrix: dequant +
/// GEMM of an 11008 × 4096 NF4 part measured 1.07x the speed of dequantizing the whole matrix
/// first, 0.92x at 256 rows (`cargo bench -p kernels --bench dequant`, AMD EPYC Zen 5, 2 cores).
pub const DEQUANT_TILE_ROWS: u64 = 1024;

/// How the frozen block matrices are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseFormat {
    F32,
    Bf16,
    /// One signed code per weight, one fp32 absmax scale per output row.
    Int8,
    /// bitsandbytes' NF4: blocks of 64 with an fp32 absmax, or double-quantized absmax.
    Nf4 {
        double_quant: bool,
    },
    /// A GGUF file's own blocks, as inference's `ggml` weights hold them: a code per weight
    /// (two a byte for the matrices in `nibbles`), then an fp32 scale and an fp32 minimum per
    /// group: w = scale × code + min, ggml's values exactly.
    Ggml(GgmlBase),
}

pub use plan::lora::GgmlBase;

impl BaseFormat {
    pub fn of(lora: &Lora) -> Result<BaseFormat, PlanError> {
        Ok(match lora.base {
            Dtype::F32 => BaseFormat::F32,
            Dtype::Bf16 => BaseFormat::Bf16,
            Dtype::Int8 => BaseFormat::Int8,
            Dtype::Nf4 => BaseFormat::Nf4 {
                double_quant: lora.double_quant,
            },
            Dtype::Ggml => match lora.ggml {
                Some(g) => BaseFormat::Ggml(g),
                None => {
                    return Err(PlanError::Invalid {
                        field: "--lora-base".into(),
                        reason: "ggml keeps a GGUF file's own blocks: give a quantized .gguf \
                                 file as the model"
                            .into(),
                    })
                }
            },
            other => {
                return Err(PlanError::Invalid {
                    field: "--lora-base".into(),
                    reason: format!(
                        "{other:?} is not a base this engine stores: use fp32, bf16, int8, nf4 \
                         or ggml"
                    ),
                })
            }
        })
    }

    /// Bytes of one HF linear of `rows` × `cols` in block matrix `role`, in this format,
    /// padded to 4.
    pub fn part_bytes(self, role: Role, rows: u64, cols: u64) -> u64 {
        let n = rows * cols;
        let bytes = match self {
            BaseFormat::Ggml(g) => {
                let codes = if g.nibbles.has(role) { n / 2 } else { n };
                codes + 8 * (n / g.group)
            }
            BaseFormat::F32 => 4 * n,
            BaseFormat::Bf16 => 2 * n,
            BaseFormat::Int8 => n + 4 * rows,
            BaseFormat::Nf4 { double_quant } => {
                formats::bnb::stored_bytes(n as usize, NF4_BLOCK as usize, double_quant) as u64
            }
        };
        bytes.div_ceil(4) * 4
    }

    pub fn name(self) -> &'static str {
        match self {
            BaseFormat::F32 => "fp32",
            BaseFormat::Bf16 => "bf16",
            BaseFormat::Int8 => "int8",
            BaseFormat::Nf4 {
                double_quant: false,
            } => "nf4",
            BaseFormat::Nf4 { double_quant: true } => "nf4 (double quant)",
            BaseFormat::Ggml(_) => "ggml",
        }
    }
}

/// One HF linear inside a block matrix: rows `row_offset .. row_offset + rows`.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// The HF module, e.g. `model.layers.0.self_attn.q_proj`.
    pub module: String,
    pub row_offset: u64,
    pub rows: u64,
    /// Byte offset of its frozen storage inside `base.h.<l>.<role>`.
    pub byte_offset: u64,
    /// Index of its adapter (`Role::LoraA(i)`, `Role::LoraB(i)`) when it is a target.
    pub adapter: Option<u8>,
}

/// One block matrix of the base: its shape and HF parts.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub role: Role,
    pub rows: u64,
    pub cols: u64,
    pub parts: Vec<Part>,
    /// Bytes of `base.h.<l>.<role>`.
    pub bytes: u64,
}

impl Matrix {
    /// Targeted parts (those with an adapter), in row order.
    pub fn targeted(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().filter(|p| p.adapter.is_some())
    }

    /// Rank-sized columns of u at this matrix: r per targeted part.
    pub fn u_width(&self, rank: u64) -> u64 {
        rank * self.targeted().count() as u64
    }
}

fn module_of(name: &str) -> &str {
    name.strip_suffix(".weight").unwrap_or(name)
}

/// Whether the HF module `module` is one of `targets`, matched as PEFT matches: the whole
/// name, or its end after a dot (`q_proj` hits `model.layers.0.self_attn.q_proj`).
fn is_target(module: &str, targets: &[String]) -> bool {
    targets.iter().any(|t| {
        t == "all-linear"
            || module == t
            || module
                .strip_suffix(t.as_str())
                .is_some_and(|head| head.ends_with('.'))
    })
}

/// The four matrices of block `layer`, with their parts' frozen offsets and adapters.
pub fn matrices(
    model: &ModelShape,
    layer: u32,
    lora: &Lora,
    base: BaseFormat,
) -> Result<Vec<Matrix>, PlanError> {
    let units = param_units(model, 1)?;
    let unit = &units[1 + layer as usize];
    let mut next_adapter = 0u8;
    Ok(MATRICES
        .iter()
        .map(|&role| {
            let view = unit.view(role);
            let (rows, cols) = (view.shape[0], view.shape[1]);
            let mut byte_offset = 0;
            let parts = (view.parts.iter().enumerate())
                .map(|(i, p)| {
                    let end = view.parts.get(i + 1).map_or(rows, |n| n.row_offset);
                    let module = module_of(&p.name).to_string();
                    let adapter = is_target(&module, &lora.targets).then(|| {
                        next_adapter += 1;
                        next_adapter - 1
                    });
                    let part = Part {
                        module,
                        row_offset: p.row_offset,
                        rows: end - p.row_offset,
                        byte_offset,
                        adapter,
                    };
                    byte_offset += base.part_bytes(role, part.rows, cols);
                    part
                })
                .collect();
            Matrix {
                role,
                rows,
                cols,
                parts,
                bytes: byte_offset,
            }
        })
        .collect())
}

/// The base's units: the model's units, without the block matrices (not sharded: every rank
/// holds the whole frozen base).
pub fn base_units(model: &ModelShape) -> Result<Vec<Unit>, PlanError> {
    let units = param_units(model, 1)?;
    Ok(units
        .into_iter()
        .map(|u| match u.kind {
            UnitKind::Block(_) => {
                let mut b = UnitBuilder::scratch();
                let kept = u.views.iter().filter(|v| !MATRICES.contains(&v.role));
                kept.for_each(|v| b.copy_view(v));
                b.finish(u.kind, 1)
            }
            _ => u,
        })
        .collect())
}

/// The adapter units, one per block, padded for `world` ranks.
pub fn adapter_units(model: &ModelShape, lora: &Lora, world: u32) -> Result<Vec<Unit>, PlanError> {
    let base = BaseFormat::of(lora)?;
    let r = u64::from(lora.rank);
    (0..model.n_layers)
        .map(|layer| {
            let mut b = UnitBuilder::scratch();
            for m in matrices(model, layer, lora, base)? {
                for p in m.targeted() {
                    let name = format!("base_model.model.{}.lora_A.weight", p.module);
                    let i = p.adapter.expect("targeted");
                    b.one(Role::LoraA(i), &[r, m.cols], &name, false);
                }
                for p in m.targeted() {
                    let name = format!("base_model.model.{}.lora_B.weight", p.module);
                    let i = p.adapter.expect("targeted");
                    b.one(Role::LoraB(i), &[p.rows, r], &name, false);
                }
            }
            Ok(b.finish(UnitKind::Block(layer), world))
        })
        .collect()
}

/// Checks a LoRA setup against the model: some linear is adapted, the rank is positive.
pub fn check(model: &ModelShape, lora: &Lora) -> Result<(), PlanError> {
    if model.moe.is_some() || model.mla.is_some() {
        return Err(PlanError::Unsupported {
            runtime: "frugal",
            what: "LoRA over mixture-of-experts or latent-attention layers (train the full model \
                   instead)"
                .into(),
        });
    }
    plan::lora::check_targets(model, &lora.targets)?;
    if lora.rank == 0 {
        return Err(PlanError::Invalid {
            field: "--lora-rank".into(),
            reason: "a rank of at least 1 is needed".into(),
        });
    }
    plan::validate::check_dropout(lora.dropout)?;
    let base = BaseFormat::of(lora)?;
    let any = matrices(model, 0, lora, base)?
        .iter()
        .any(|m| m.targeted().next().is_some());
    if !any {
        return Err(PlanError::Invalid {
            field: "--lora-targets".into(),
            reason: format!(
                "no linear layer of {} matches {}",
                model.name,
                lora.targets.join(",")
            ),
        });
    }
    Ok(())
}

/// The frozen base's buffers and the LoRA step's own activations and scratch (the adapters'
/// weights, gradients and optimizer state come from `shards::state_buffers` on the adapter
/// units).
pub fn lora_buffers(
    model: &ModelShape,
    lora: &Lora,
    dims: &BlockDims,
    policy: ActPolicy,
) -> Result<Vec<Buffer>, PlanError> {
    let base = BaseFormat::of(lora)?;
    let r = u64::from(lora.rank);
    let keyed =
        |key, category, bytes, lifetime| Buffer::keyed(key, category, Device::Gpu, bytes, lifetime);
    let mut out: Vec<Buffer> = base_units(model)?
        .iter()
        .map(|u| {
            keyed(
                Key::Base(u.kind),
                Category::Params,
                4 * u.numel,
                Lifetime::Persistent,
            )
        })
        .collect();
    let (mut largest_part, mut widest_u) = (0, 0);
    // Recomputed exactly when the block's matmul outputs are.
    let recomputed = policy.recomputes(BlockTensor::Qkv);
    for layer in 0..model.n_layers {
        let born_bwd = policy
            .segment(model.n_layers, layer)
            .map_or(layer, |(_, last)| last);
        for m in matrices(model, layer, lora, base)? {
            out.push(keyed(
                Key::Frozen(layer, m.role),
                Category::Params,
                m.bytes,
                Lifetime::Persistent,
            ));
            let tile = |p: &Part| p.rows.min(DEQUANT_TILE_ROWS) * m.cols;
            largest_part = largest_part.max(m.parts.iter().map(tile).max().unwrap_or(0));
            let width = m.u_width(r);
            if width == 0 {
                continue;
            }
            widest_u = widest_u.max(width);
            let bytes = 4 * dims.n * width;
            let act = Category::Activations;
            let f = Phase::Forward(layer);
            let born = if recomputed {
                Phase::Backward(born_bwd)
            } else {
                f
            };
            let life = Lifetime::Span {
                born,
                dies: Phase::Backward(layer),
            };
            out.push(keyed(Key::LoraU(layer, m.role), act, bytes, life));
            if recomputed {
                let fwd = Lifetime::Span { born: f, dies: f };
                out.push(keyed(Key::LoraUFwd(layer, m.role), act, bytes, fwd));
            }
        }
    }
    let whole = Lifetime::Span {
        born: Phase::Embed,
        dies: Phase::Backward(0),
    };
    if base != BaseFormat::F32 {
        let bytes = 4 * largest_part;
        out.push(keyed(
            Key::Work(Work::Dequant),
            Category::Other,
            bytes,
            whole,
        ));
    }
    let backward = Lifetime::Span {
        born: Phase::Backward(model.n_layers - 1),
        dies: Phase::Backward(0),
    };
    let du = 4 * dims.n * widest_u;
    out.push(keyed(
        Key::Work(Work::LoraDu),
        Category::Activations,
        du,
        backward,
    ));
    if lora.dropout > 0.0 {
        // The dropped input is rebuilt wherever an adapter runs (forward, recompute, backward).
        let widest_in = dims.c.max(dims.atty).max(dims.fc_act);
        let bytes = 4 * dims.n * widest_in;
        let other = Category::Other;
        out.push(keyed(Key::Work(Work::LoraDropped), other, bytes, whole));
        out.push(keyed(Key::Work(Work::LoraDx), other, bytes, backward));
    }
    Ok(out)
}
