//! The frozen base's bytes: fp32 units (as the model's, seeded or read from HF safetensors) cut
//! into the base's fp32 pieces and its block matrices packed in the base format, one HF linear at
//! a time: bf16 rounded to nearest even, int8 with one absmax scale per row, NF4 exactly as
//! bitsandbytes (`formats::bnb`, run over runs of whole blocks in parallel and double-quantized
//! over the whole linear).
//!
//! Example: `base::init_random(&model, &arena, 1337)` gives the base the weights a full model
//! would get from that seed, quantized.

use super::{matrix_index, LoraModel};
use crate::arena::Arena;
use crate::backend::{Backend, DType};
use crate::error::EngineError;
use crate::model::{view_range, Model};
use plan_frugal::adapters::{BaseFormat, MATRICES, NF4_BLOCK};
use plan_frugal::units::{Role, Unit, UnitKind};
use rayon::prelude::*;

/// Values per parallel quantization task (a whole number of NF4 blocks).
const TASK: usize = 1 << 16;

/// One HF linear (`rows` × `cols`, row-major) of block matrix `role` in `format`, padded to
/// `format.part_bytes`. A `ggml` base quantizes values into its layout (4-bit codes with a
/// minimum, Q4_1-like, for the matrices it keeps two a byte; 8-bit with none, Q8_0-like, for the
/// rest): what a base starts as before a GGUF file's own blocks replace it ([`put_blocks`]).
pub fn pack_part(
    values: &[f32],
    role: Role,
    rows: usize,
    cols: usize,
    format: BaseFormat,
) -> Vec<u8> {
    assert_eq!(values.len(), rows * cols);
    let mut out: Vec<u8> = match format {
        BaseFormat::Ggml(g) => ggml_quantized(values, g.group as usize, g.nibbles.has(role)),
        BaseFormat::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        BaseFormat::Bf16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        BaseFormat::Int8 => {
            let scales: Vec<f32> = values
                .chunks(cols)
                .map(|row| row.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0)
                .collect();
            let codes = values.chunks(cols).zip(&scales).flat_map(|(row, &s)| {
                row.iter().map(move |&x| match s {
                    0.0 => 0u8,
                    _ => (x / s).round().clamp(-127.0, 127.0) as i8 as u8,
                })
            });
            codes
                .chain(scales.iter().flat_map(|s| s.to_le_bytes()))
                .collect()
        }
        BaseFormat::Nf4 { double_quant } => nf4(values, double_quant),
    };
    out.resize(
        format.part_bytes(role, rows as u64, cols as u64) as usize,
        0,
    );
    out
}

/// `values` in groups of `group`: codes 0..15 with scale (max − min)/15 and minimum min (two a
/// byte, int4's sub-block order) with `nibbles`, else codes ±127 with scale absmax/127; then the
/// scales and minima as f32.
fn ggml_quantized(values: &[f32], group: usize, nibbles: bool) -> Vec<u8> {
    let groups = values.len() / group;
    let (mut codes, mut scales, mut mins) = (
        Vec::with_capacity(values.len()),
        Vec::with_capacity(groups),
        Vec::with_capacity(groups),
    );
    for g in values.chunks(group) {
        let (lo, hi) = g
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        let (scale, min, top) = match nibbles {
            true => ((hi - lo) / 15.0, lo, 15.0),
            false => (lo.abs().max(hi.abs()) / 127.0, 0.0, 127.0),
        };
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        codes.extend(g.iter().map(|&x| match nibbles {
            true => ((x - min) * inv).round().clamp(0.0, top) as u8,
            false => (x * inv).round().clamp(-top, top) as i8 as u8,
        }));
        scales.push(scale);
        mins.push(min);
    }
    let mut out = match nibbles {
        true => kernels::qmatmul::pack_nibbles(&codes),
        false => codes,
    };
    out.extend(scales.iter().chain(&mins).flat_map(|x| x.to_le_bytes()));
    out
}

/// A GGUF file's blocks for one HF linear, as the `ggml` base holds them: a code per weight
/// (0..15 for a matrix kept two a byte), a scale and a minimum per group.
pub struct Blocks {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub mins: Vec<f32>,
}

/// Replaces every block matrix of a `ggml` base with the blocks `blocks(hf_name, nibbles)`
/// gives for each of its HF linears (codes 0..15 when `nibbles`, the matrix's codes kept two a
/// byte): the values it trains over are the file's exactly. Call after the base is loaded from
/// the file's values ([`load_with`]).
pub fn put_blocks<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    mut blocks: impl FnMut(&str, bool) -> Result<Blocks, EngineError>,
) -> Result<(), EngineError> {
    let lora = model.lora.as_ref().expect("a LoRA model");
    let BaseFormat::Ggml(g) = lora.format else {
        panic!("put_blocks is for a ggml base");
    };
    let be = arena.backend();
    let units = full_units(model);
    for unit in &units {
        let UnitKind::Block(layer) = unit.kind else {
            continue;
        };
        for role in MATRICES {
            let fm = &lora.matrices[layer as usize][matrix_index(role)];
            let view = unit.view(role);
            let cols = fm.matrix.cols;
            for (p, hf) in fm.matrix.parts.iter().zip(&view.parts) {
                let b = blocks(&hf.name, g.nibbles.has(role))?;
                let n = (p.rows * cols) as usize;
                if b.codes.len() != n || b.scales.len() * g.group as usize != n {
                    return Err(EngineError::Data(format!(
                        "{}: {} codes and {} scales for {n} weights in groups of {}",
                        hf.name,
                        b.codes.len(),
                        b.scales.len(),
                        g.group
                    )));
                }
                let mut bytes = match g.nibbles.has(role) {
                    true => kernels::qmatmul::pack_nibbles(&b.codes),
                    false => b.codes,
                };
                bytes.extend(b.scales.iter().chain(&b.mins).flat_map(|x| x.to_le_bytes()));
                bytes.resize(lora.format.part_bytes(role, p.rows, cols) as usize, 0);
                let off = p.byte_offset as usize;
                let dst = arena.tensor(fm.id, DType::U8).slice(off..off + bytes.len());
                be.upload_bytes(arena, dst, &bytes);
            }
        }
    }
    Ok(())
}

/// bitsandbytes' NF4 bytes: packed codes, then the absmax (fp32, or codes, scales and offset).
fn nf4(values: &[f32], double_quant: bool) -> Vec<u8> {
    let block = NF4_BLOCK as usize;
    let pieces: Vec<formats::bnb::Nf4> = values
        .par_chunks(TASK)
        .map(|c| formats::bnb::quantize(c, block, false))
        .collect();
    let mut out: Vec<u8> = pieces
        .iter()
        .flat_map(|p| p.packed.iter().copied())
        .collect();
    let absmax: Vec<f32> = pieces
        .iter()
        .flat_map(|p| match &p.absmax {
            formats::bnb::Absmax::F32(a) => a.clone(),
            formats::bnb::Absmax::Double { .. } => unreachable!("quantized without"),
        })
        .collect();
    match double_quant {
        false => out.extend(absmax.iter().flat_map(|a| a.to_le_bytes())),
        true => {
            let formats::bnb::Absmax::Double {
                codes,
                offset,
                absmax2,
            } = formats::bnb::double_quantize(&absmax)
            else {
                unreachable!("double quantization")
            };
            out.extend(codes);
            out.extend(absmax2.iter().flat_map(|a| a.to_le_bytes()));
            out.extend(offset.to_le_bytes());
        }
    }
    out
}

/// Writes full model unit `u` (`values`, its `numel` elements in the model's layout `unit`) into
/// the base: its fp32 pieces into `base.<u>`, each block matrix's parts packed into
/// `base.h.<l>.<role>`.
pub fn upload_unit<B: Backend>(
    lora: &LoraModel,
    arena: &Arena<B>,
    u: usize,
    unit: &Unit,
    values: &[f32],
) {
    let be = arena.backend();
    let base = &lora.base_units[u];
    let mut fp32 = vec![0.0f32; base.numel as usize];
    for view in unit.views.iter().filter(|v| !MATRICES.contains(&v.role)) {
        fp32[view_range(base.view(view.role))].copy_from_slice(&values[view_range(view)]);
    }
    be.upload(arena, arena.tensor(lora.base_ids[u], DType::F32), &fp32);
    let UnitKind::Block(layer) = unit.kind else {
        return;
    };
    for role in MATRICES {
        let fm = &lora.matrices[layer as usize][matrix_index(role)];
        let view = &values[view_range(unit.view(role))];
        let cols = fm.matrix.cols as usize;
        for p in &fm.matrix.parts {
            let rows = &view[p.row_offset as usize * cols..][..p.rows as usize * cols];
            let bytes = pack_part(rows, role, p.rows as usize, cols, lora.format);
            let off = p.byte_offset as usize;
            let dst = arena.tensor(fm.id, DType::U8).slice(off..off + bytes.len());
            be.upload_bytes(arena, dst, &bytes);
        }
    }
}

/// The full model's units (the layout HF names and the initialisation follow).
fn full_units(model: &Model) -> Vec<Unit> {
    plan_frugal::param_units(&model.config.shape, 1).expect("the plan built this model")
}

/// The base from `seed`: exactly the weights `init::fill_unit` gives a full model, packed.
pub fn init_random<B: Backend>(model: &Model, arena: &Arena<B>, seed: u64) {
    let lora = model.lora.as_ref().expect("a LoRA model");
    let n_layers = model.config.shape.n_layers;
    for (u, unit) in full_units(model).iter().enumerate() {
        let mut values = vec![0.0f32; unit.numel as usize];
        crate::init::fill(unit, u, n_layers, &mut values, seed);
        upload_unit(lora, arena, u, unit, &values);
    }
}

/// The base from HF safetensors files (a folder's `model.safetensors` or its shards), each
/// name behind `prefix` (golden files keep `weights.<name>`).
pub fn load_files<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    files: &[(String, &[u8])],
    prefix: &str,
) -> Result<(), EngineError> {
    load_with(model, arena, |units| {
        crate::io::read_units(units, files, prefix)
    })
}

/// The base from saved weights: `read` gets the full model's unit layout and returns every
/// unit's values (an HF folder's, a GGUF file's), checked before any is packed.
pub fn load_with<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    read: impl FnOnce(&[Unit]) -> Result<Vec<Vec<f32>>, EngineError>,
) -> Result<(), EngineError> {
    let lora = model.lora.as_ref().expect("a LoRA model");
    let units = full_units(model);
    let values = read(&units)?;
    for (u, (unit, v)) in units.iter().zip(&values).enumerate() {
        upload_unit(lora, arena, u, unit, v);
    }
    Ok(())
}

/// Full model unit `u`'s values as the base holds them (block matrices dequantized): the
/// weights a merged export starts from.
pub fn dequantized_unit<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    u: usize,
    unit: &Unit,
) -> Vec<f32> {
    let lora = model.lora.as_ref().expect("a LoRA model");
    let be = arena.backend();
    let base = &lora.base_units[u];
    let mut fp32 = vec![0.0f32; base.numel as usize];
    be.download(arena, arena.tensor(lora.base_ids[u], DType::F32), &mut fp32);
    let mut values = vec![0.0f32; unit.numel as usize];
    for view in unit.views.iter().filter(|v| !MATRICES.contains(&v.role)) {
        values[view_range(view)].copy_from_slice(&fp32[view_range(base.view(view.role))]);
    }
    let UnitKind::Block(layer) = unit.kind else {
        return values;
    };
    let (levels, map) = (
        std::array::from_fn(|i| formats::NF4_LEVELS[i] as f32),
        formats::bnb::dynamic_map(),
    );
    for role in MATRICES {
        let fm = &lora.matrices[layer as usize][matrix_index(role)];
        let cols = fm.matrix.cols as usize;
        let view = view_range(unit.view(role));
        for p in &fm.matrix.parts {
            let bytes_len = lora.format.part_bytes(role, p.rows, fm.matrix.cols) as usize;
            let off = p.byte_offset as usize;
            let mut bytes = vec![0u8; bytes_len];
            be.download_bytes(
                arena,
                arena.tensor(fm.id, DType::U8).slice(off..off + bytes_len),
                &mut bytes,
            );
            let start = view.start + p.row_offset as usize * cols;
            let dst = &mut values[start..start + p.rows as usize * cols];
            let format = (lora.format, role);
            decode_with(dst, &bytes, p.rows as usize, format, (&levels, &map));
        }
    }
    values
}

/// One HF linear's values (`rows` × cols, into `dst`) from its bytes in `format`, in block
/// matrix `role`.
pub fn decode_part(dst: &mut [f32], bytes: &[u8], rows: usize, format: BaseFormat, role: Role) {
    let levels = std::array::from_fn(|i| formats::NF4_LEVELS[i] as f32);
    decode_with(
        dst,
        bytes,
        rows,
        (format, role),
        (&levels, &formats::bnb::dynamic_map()),
    );
}

/// How one HF linear of block matrix `role` is stored in `format` (an fp32 base: `None`, read
/// as it is).
pub fn stored(format: BaseFormat, role: Role, rows: usize) -> Option<kernels::dequant::Stored> {
    use kernels::dequant::Stored;
    Some(match format {
        BaseFormat::F32 => return None,
        BaseFormat::Bf16 => Stored::Bf16,
        BaseFormat::Int8 => Stored::Int8 { rows },
        BaseFormat::Nf4 { double_quant } => Stored::Nf4 {
            block: NF4_BLOCK as usize,
            double: double_quant,
        },
        BaseFormat::Ggml(g) => Stored::Grouped {
            group: g.group as usize,
            nibbles: g.nibbles.has(role),
        },
    })
}

fn decode_with(
    dst: &mut [f32],
    bytes: &[u8],
    rows: usize,
    (format, role): (BaseFormat, Role),
    (levels, map): (&[f32; 16], &[f32; 256]),
) {
    use kernels::dequant::dequantize;
    let Some(stored) = stored(format, role, rows) else {
        for (x, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = f32::from_le_bytes(b.try_into().expect("four bytes"));
        }
        return;
    };
    dequantize(dst, bytes, stored, levels, map);
}
