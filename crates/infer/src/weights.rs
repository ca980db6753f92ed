//! Weights into a worker: fp32 units (a trained model, an HF checkpoint) packed into the storage
//! format, or random codes written directly in it (benchmarks of 7B-shaped models, which never
//! exist in fp32 here).
//!
//! Packing quantizes with the `formats` crate's policies (round to nearest even, fp16 scales
//! rounded up so nothing clips, exact zeros): int8 per output row, int4 per group (symmetric:
//! codes −7..7 stored as q + 8; asymmetric: 0..15 with a zero point), nf4 per group with an fp32
//! absmax; then 4-bit codes are packed in the kernels' sub-block nibble order
//! (`kernels::qmatmul::pack_nibbles`). Random weights are uniform codes with scales that give a
//! standard deviation near 0.02 (GPT-2's initialisation), norms at one and biases at zero.
//!
//! Example: `worker.load_units(&units)?` after `Runner`/`Snapshot` produced the fp32 units.

use super::Worker;
use data::SplitMix64;
use engine::arena::BufId;
use engine::backend::InferOps;
use engine::backend::{QMatrix, Tensor};
use engine::error::EngineError;
use formats::quant::{quantize, Granularity, QuantConfig, Scheme, Symmetry};
use formats::{Format, IntRange};
use half::{bf16, f16};
use plan_frugal::serve::is_matrix;
use plan_frugal::units::{ParamView, Role, Unit};
use plan_frugal::{Roles, WeightFormat};

/// A matrix already in the worker's format, if its source holds one: `(unit, view)` → bytes.
pub type StoredMatrix<'a> =
    dyn FnMut(&Unit, &ParamView) -> Result<Option<Packed>, EngineError> + 'a;

/// A matrix's stored bytes: codes (or values), scales, zero points.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Packed {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub zeros: Vec<u8>,
}

/// Quantizes `values` (rows, cols) into `format`'s stored bytes.
pub fn pack(
    format: WeightFormat,
    values: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Packed, EngineError> {
    assert_eq!(values.len(), rows * cols);
    let fail = |e: formats::QuantError| EngineError::Weights {
        path: "quantization".into(),
        reason: e.to_string(),
    };
    let config = |scheme, granularity, symmetry, scale_format| QuantConfig {
        scheme,
        granularity,
        symmetry,
        scale_format,
    };
    let f16_bytes = |s: &[f64]| -> Vec<u8> {
        s.iter()
            .flat_map(|&x| f16::from_f64(x).to_le_bytes())
            .collect()
    };
    Ok(match format {
        WeightFormat::F32 => Packed {
            codes: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ..Packed::default()
        },
        WeightFormat::Bf16 => Packed {
            codes: values
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
            ..Packed::default()
        },
        WeightFormat::Int8 => {
            let c = config(
                Scheme::Int8,
                Granularity::PerChannel,
                Symmetry::Symmetric,
                Format::F16,
            );
            let q = quantize(values, rows, cols, &c).map_err(fail)?;
            Packed {
                codes: q.codes.clone(),
                scales: f16_bytes(&q.scales),
                zeros: Vec::new(),
            }
        }
        WeightFormat::Int4 { group, asym } => {
            let symmetry = if asym {
                Symmetry::Asymmetric
            } else {
                Symmetry::Symmetric
            };
            let g = Granularity::PerGroup(group as usize);
            let q = quantize(
                values,
                rows,
                cols,
                &config(Scheme::Int4, g, symmetry, Format::F16),
            )
            .map_err(fail)?;
            let codes: Vec<u8> = if asym {
                q.codes.clone()
            } else {
                q.codes
                    .iter()
                    .map(|&b| (IntRange::INT4.from_bits(u32::from(b)) + 8) as u8)
                    .collect()
            };
            Packed {
                codes: kernels::qmatmul::pack_nibbles(&codes),
                scales: f16_bytes(&q.scales),
                zeros: q.zero_points.iter().map(|&z| z as u8).collect(),
            }
        }
        WeightFormat::Ggml { group, nibbles } if nibbles == Roles::NONE => {
            ggml_q8(values, group as usize)
        }
        WeightFormat::Ggml { .. } => {
            return Err(EngineError::Weights {
                path: "quantization".into(),
                reason: "ggml's 4-bit codes come only from a GGUF file's Q4_0, Q4_1 and Q4_K \
                         blocks"
                    .into(),
            })
        }
        WeightFormat::Nf4 { group } => {
            let g = Granularity::PerGroup(group as usize);
            let c = config(Scheme::Nf4, g, Symmetry::Symmetric, Format::F32);
            let q = quantize(values, rows, cols, &c).map_err(fail)?;
            Packed {
                codes: kernels::qmatmul::pack_nibbles(&q.codes),
                scales: q
                    .scales
                    .iter()
                    .flat_map(|&s| (s as f32).to_le_bytes())
                    .collect(),
                zeros: Vec::new(),
            }
        }
    })
}

/// Values quantized Q8_0-like, per group: scale absmax / 127 kept in fp32 (Q8_0 keeps fp16),
/// codes rounded to nearest even, minima of zero.
fn ggml_q8(values: &[f32], group: usize) -> Packed {
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / group);
    for g in values.chunks_exact(group) {
        let amax = g.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        codes.extend(g.iter().map(|x| (x * inv).round_ties_even() as i8 as u8));
        scales.push(d);
    }
    let zeros = vec![0.0; scales.len()];
    Packed::grouped(codes, &scales, &zeros)
}

impl Packed {
    /// Grouped int8 (the `ggml` format): codes, then fp32 scales and minima.
    pub fn grouped(codes: Vec<u8>, scales: &[f32], mins: &[f32]) -> Packed {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Packed {
            codes,
            scales: bytes(scales),
            zeros: bytes(mins),
        }
    }

    /// Grouped codes one a byte, each 0..15, packed two a byte in the kernels' sub-block order;
    /// rows of `cols` must be whole sub-blocks of 32.
    pub fn into_nibbles(self, cols: usize) -> Result<Packed, String> {
        if cols % kernels::qmatmul::SUB != 0 {
            return Err(format!(
                "rows of {cols} 4-bit codes are not whole blocks of {}",
                kernels::qmatmul::SUB
            ));
        }
        if let Some(c) = self.codes.iter().find(|&&c| c > 15) {
            return Err(format!("a code of {} does not fit in 4 bits", *c as i8));
        }
        Ok(Packed {
            codes: kernels::qmatmul::pack_nibbles(&self.codes),
            ..self
        })
    }
}

/// Random stored bytes for a (rows, cols) matrix of `format` (standard deviation near 0.02).
pub fn random_packed(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    rng: &mut SplitMix64,
) -> Packed {
    let n = rows * cols;
    let mut bytes = |len: usize| -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    };
    // Uniform on ±a has standard deviation a/√3: a = 0.0346 gives 0.02.
    let a = 0.02 * 3f32.sqrt();
    let f16s = |len: usize, x: f32| -> Vec<u8> {
        (0..len)
            .flat_map(|_| f16::from_f32(x).to_le_bytes())
            .collect()
    };
    match format {
        WeightFormat::F32 => Packed {
            codes: bytes(4 * n)
                .chunks_exact(4)
                .flat_map(|b| (uniform(b) * a).to_le_bytes())
                .collect(),
            ..Packed::default()
        },
        WeightFormat::Bf16 => Packed {
            codes: bytes(4 * n)
                .chunks_exact(4)
                .flat_map(|b| bf16::from_f32(uniform(b) * a).to_le_bytes())
                .collect(),
            ..Packed::default()
        },
        WeightFormat::Int8 => Packed {
            // Codes in −127..=127 (−128 is not a symmetric int8 code).
            codes: bytes(n)
                .into_iter()
                .map(|b| if b == 0x80 { 0x81 } else { b })
                .collect(),
            scales: f16s(rows, a / 127.0),
            zeros: Vec::new(),
        },
        WeightFormat::Int4 { group, asym } => {
            let groups = n / group as usize;
            Packed {
                // Codes 0..=15 around a zero point of 8 (llama.cpp's Q4_0 values when symmetric).
                codes: bytes(n / 2),
                scales: f16s(groups, a / 7.0),
                zeros: if asym { vec![8; groups] } else { Vec::new() },
            }
        }
        WeightFormat::Ggml { group, nibbles } if nibbles != Roles::NONE => {
            let groups = n / group as usize;
            // Codes 0..=15 around a minimum of −8 steps (Q4_0's values).
            let scales = vec![a / 7.0; groups];
            let mins: Vec<f32> = scales.iter().map(|s| -8.0 * s).collect();
            Packed::grouped(bytes(n / 2), &scales, &mins)
        }
        WeightFormat::Ggml { group, .. } => {
            let groups = n / group as usize;
            // Codes in −127..=127, as int8's.
            let codes = bytes(n)
                .into_iter()
                .map(|b| if b == 0x80 { 0x81 } else { b })
                .collect();
            Packed::grouped(codes, &vec![a / 127.0; groups], &vec![0.0; groups])
        }
        WeightFormat::Nf4 { group } => Packed {
            codes: bytes(n / 2),
            scales: (0..n / group as usize)
                .flat_map(|_| (a * 1.2).to_le_bytes())
                .collect(),
            zeros: Vec::new(),
        },
    }
}

/// Uniform in [−1, 1) from 4 random bytes.
fn uniform(b: &[u8]) -> f32 {
    let u = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (u >> 8) as f32 / (1u32 << 23) as f32 - 1.0
}

impl<B: InferOps> Worker<B> {
    /// Writes one matrix's stored bytes (in the backend's layout for it).
    pub fn upload_matrix(&self, m: &QMatrix, p: &Packed) {
        let parts = [&p.codes[..], &p.scales, &p.zeros];
        self.arena.backend().upload_matrix(&self.arena, m, parts);
    }

    /// Rearranges every matrix the backend keeps in a layout of its own from the packer's
    /// layout, as raw bytes wrote it (a weights file's load), into the backend's.
    pub(crate) fn relayout(&self) {
        let (a, be) = (&self.arena, self.arena.backend());
        for w in &self.weights {
            for (_, m) in w.matrices.iter().filter(|(_, m)| be.own_layout(m)) {
                let parts = [Some(m.codes), m.scales, m.zeros].map(|t| {
                    let mut bytes = vec![0u8; t.map_or(0, |t| t.len * t.dtype.size_bytes())];
                    if let Some(t) = t {
                        be.download_bytes(a, t, &mut bytes);
                    }
                    bytes
                });
                be.upload_matrix(a, m, [&parts[0][..], &parts[1], &parts[2]]);
            }
        }
    }

    /// The parts (codes, scales, zero points) in buffer `buf` of the matrices the backend keeps
    /// in a layout of its own, each with its bytes in the packer's layout: what a weights file
    /// holds in their place.
    pub(crate) fn packed_parts(&self, buf: BufId) -> Vec<(Tensor, Vec<u8>)> {
        let (a, be) = (&self.arena, self.arena.backend());
        let mut out = Vec::new();
        for w in &self.weights {
            for (_, m) in w.matrices.iter().filter(|(_, m)| be.own_layout(m)) {
                let tensors = [Some(m.codes), m.scales, m.zeros];
                if !tensors.iter().flatten().any(|t| t.buf == buf) {
                    continue;
                }
                let mut parts =
                    tensors.map(|t| vec![0u8; t.map_or(0, |t| t.len * t.dtype.size_bytes())]);
                let [c, s, z] = &mut parts;
                be.download_matrix(a, m, [c, s, z]);
                let held = tensors
                    .into_iter()
                    .zip(parts)
                    .filter_map(|(t, p)| Some((t?, p)));
                out.extend(held.filter(|(t, _)| t.buf == buf));
            }
        }
        out
    }

    /// Quantizes fp32 units (each unit's flat elements, as `Runner`/`Snapshot` hold them) into
    /// the worker's weight format.
    pub fn load_units(&mut self, units: &[Vec<f32>]) -> Result<(), EngineError> {
        self.load_units_with(units, &mut |_, _| Ok(None))
    }

    /// As [`Worker::load_units`], except for the matrices `stored(unit, view)` gives already in
    /// the worker's format (a GGUF file's blocks, repacked exactly).
    pub fn load_units_with(
        &mut self,
        units: &[Vec<f32>],
        stored: &mut StoredMatrix<'_>,
    ) -> Result<(), EngineError> {
        assert_eq!(units.len(), self.units.len(), "one fp32 buffer per unit");
        for (u, values) in units.iter().enumerate() {
            let unit = &self.units[u];
            let mut vectors = Vec::new();
            for v in &unit.views {
                let (o, n) = (v.offset as usize, v.numel() as usize);
                let x = &values[o..o + n];
                if is_matrix(v.role) {
                    let m = self.weights[u].matrix(v.role);
                    if let Some(p) = stored(unit, v)? {
                        let p = match m.format.nibbles(v.role) {
                            true => {
                                p.into_nibbles(m.cols)
                                    .map_err(|reason| EngineError::Weights {
                                        path: format!("{} of unit {}", v.parts[0].name, unit.name),
                                        reason,
                                    })?
                            }
                            false => p,
                        };
                        self.upload_matrix(&m, &p);
                        continue;
                    }
                    let p = pack(m.format, x, m.rows, m.cols).map_err(|e| match e {
                        EngineError::Weights { reason, .. } => EngineError::Weights {
                            path: format!("{} of unit {}", v.parts[0].name, unit.name),
                            reason,
                        },
                        e => e,
                    })?;
                    self.upload_matrix(&m, &p);
                } else {
                    vectors.extend_from_slice(x);
                }
            }
            self.upload_vectors(u, &vectors);
        }
        Ok(())
    }

    fn upload_vectors(&self, u: usize, values: &[f32]) {
        let w = &self.weights[u];
        let mut at = 0;
        for (_, t) in &w.vectors {
            self.arena
                .backend()
                .upload(&self.arena, *t, &values[at..at + t.len]);
            at += t.len;
        }
    }

    /// Random weights built directly in the storage format (no fp32 copy).
    pub fn fill_random(&mut self, seed: u64) {
        let mut rng = SplitMix64::new(seed);
        for u in 0..self.units.len() {
            let unit = &self.units[u];
            let mut vectors = Vec::new();
            for v in &unit.views {
                if is_matrix(v.role) {
                    let m = self.weights[u].matrix(v.role);
                    let p = random_packed(m.format, m.rows, m.cols, &mut rng);
                    self.upload_matrix(&m, &p);
                    continue;
                }
                let n = v.numel() as usize;
                let fill = match v.role {
                    Role::Norm1Weight | Role::Norm2Weight | Role::FinalNormWeight => 1.0,
                    Role::PositionEmbedding => 0.01,
                    _ => 0.0,
                };
                if v.role == Role::PositionEmbedding {
                    vectors.extend((0..n).map(|_| {
                        let b = rng.next_u64().to_le_bytes();
                        uniform(&b[..4]) * fill
                    }));
                } else {
                    vectors.extend(std::iter::repeat_n(fill, n));
                }
            }
            self.upload_vectors(u, &vectors);
        }
    }
}
