//! One inference step as backend ops: cache slots reserved (new blocks, copy-on-write of a
//! shared last block), the tokens embedded, every block run over the step's rows (norm, q|k|v,
//! RoPE at each row's own position, the keys and values written to the cache, paged attention
//! over each row's sequence, projections, MLP), the final norm and the logits of the last rows.
//! Rows of one step may belong to different sequences at different positions; a prefill chunk's
//! rows write their keys before attending, so each row sees its own prefix causally.

use super::blocks::SeqId;
use super::{step_tensor, unit_index, SplitK, Worker};
use engine::backend::ops::{Activation, NormKind, NormOp, RopeShape};
use engine::backend::InferOps;
use engine::backend::{EmbedRows, KvWrite, PagedAttention, QLinear, SeqRow, Tensor};
use engine::error::EngineError;
use plan::buffer::Phase;
use plan_frugal::family::{Norm, Positions};
use plan_frugal::units::{Role, UnitKind};
use plan_frugal::{StepAct, StepKind};

/// KV positions from which a decode step whose (row, KV head) tasks do not share out evenly over
/// the threads splits each task's KV range (SmolLM2's 3 KV heads on 2 threads: 75 → 89 tokens/s
/// at 210 positions; at a few dozen the merge costs about what the idle thread does).
const UNEVEN_SPLIT_FROM: usize = 128;

impl<B: InferOps> Worker<B> {
    /// Appends `n` slots to `id`, pushing each new token's (block, slot); a shared block it
    /// writes into is copied first, in every layer's cache.
    fn grow(&mut self, id: SeqId, n: usize, slots: &mut Vec<(u32, u32)>) {
        let mut copies = Vec::new();
        self.blocks.grow(id, n, slots, &mut copies);
        let be = self.arena.backend();
        for (old, new) in copies {
            for cache in &self.caches {
                be.kv_copy_block(&self.arena, cache, old as usize, new as usize);
            }
        }
    }

    /// Refuses a token id outside the model's vocabulary.
    pub(crate) fn check_tokens(
        &self,
        tokens: impl Iterator<Item = u32>,
    ) -> Result<(), EngineError> {
        let vocab = self.vocab() as u64;
        for t in tokens {
            if u64::from(t) >= vocab {
                return Err(EngineError::Infer(format!(
                    "token id {t} is beyond the model's vocabulary of {vocab}"
                )));
            }
        }
        Ok(())
    }

    /// KV splits per (row, KV head) task of a step of `rows` rows whose longest sequence holds
    /// `longest` positions.
    fn splits(&self, kind: StepKind, rows: usize, longest: usize) -> usize {
        let planned = self.setup.split_k as usize;
        if kind == StepKind::Prefill || planned <= 1 {
            return 1;
        }
        match self.split_k {
            SplitK::Off => 1,
            SplitK::Fixed(k) => k.clamp(1, planned),
            SplitK::Auto => {
                let tasks = (rows * self.config.shape.n_kv_heads as usize).max(1);
                let threads = rayon::current_num_threads();
                // Tasks that do not share out evenly (3 KV heads on 2 threads) are split too
                // once the KV range is long enough for the idle thread to matter more than the
                // split's merge.
                let even = tasks % threads == 0 || tasks >= 4 * threads;
                if tasks >= threads && (even || longest < UNEVEN_SPLIT_FROM) {
                    1
                } else {
                    (2 * threads).div_ceil(tasks).min(planned)
                }
            }
        }
    }

    /// Runs one step over `entries` (a sequence and the tokens it appends); the logits of the
    /// step's last `logit_rows` rows go to `logits`.
    pub(crate) fn step(
        &mut self,
        kind: StepKind,
        entries: &[(SeqId, &[u32])],
        logit_rows: usize,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        if entries.is_empty() {
            return Ok(());
        }
        // Every token is checked before any sequence grows: a refused step changes nothing.
        self.check_tokens(entries.iter().flat_map(|(_, t)| t.iter().copied()))?;
        let mut slots = Vec::new();
        let mut positions = Vec::new();
        let mut tokens = Vec::new();
        let mut owners = Vec::new();
        for &(id, toks) in entries {
            let start = self.blocks.seq(id).len;
            self.grow(id, toks.len(), &mut slots);
            positions.extend((start..start + toks.len()).map(|p| p as u32));
            tokens.extend_from_slice(toks);
            owners.extend(std::iter::repeat_n(id, toks.len()));
        }
        let phase = match kind {
            StepKind::Prefill => Phase::Prefill,
            StepKind::Decode => Phase::Decode,
        };
        self.arena.enter(phase);
        let longest = positions.iter().max().map_or(0, |&p| p as usize + 1);
        let splits = self.splits(kind, tokens.len(), longest);
        self.run(
            kind, &tokens, &positions, &slots, &owners, splits, logit_rows, logits,
        );
        self.arena.leave(phase);
        for &(id, _) in entries {
            self.blocks.release_outside_window(id);
        }
        self.tp_check()
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        kind: StepKind,
        tokens: &[u32],
        positions: &[u32],
        slots: &[(u32, u32)],
        owners: &[SeqId],
        splits: usize,
        logit_rows: usize,
        logits: &mut Vec<f32>,
    ) {
        let (a, be) = (&self.arena, self.arena.backend());
        let s = &self.config.shape;
        let n = tokens.len();
        let (c, v) = (s.d_model as usize, s.vocab as usize);
        let t = |act| step_tensor(a, kind, act);
        let get = |act| t(act).expect("a step tensor");
        let (residual, ln, rstd) = (get(StepAct::Residual), get(StepAct::Ln), get(StepAct::Rstd));
        let (qkv, atty, proj) = (get(StepAct::Qkv), get(StepAct::Atty), get(StepAct::Proj));
        let (fch, fch_act) = (get(StepAct::Fch), get(StepAct::FchAct));
        let mean = t(StepAct::Mean);
        let tok = get(StepAct::Tokens);
        be.upload_ids(a, tok.prefix(n), tokens);
        let embed = &self.weights[unit_index(&self.units, UnitKind::Embed)];
        // Tensor parallelism: what is added once is added by rank 0, partial sums meet here.
        let tp = self.tp.as_ref();
        let lead = tp.is_none_or(|t| t.lead());
        let sum = |x: Tensor| {
            if let Some(t) = tp {
                t.sum(a, x);
            }
        };
        let learned = self.design.positions == Positions::Learned && lead;
        be.embed_rows(
            a,
            &EmbedRows {
                out: residual,
                tokens: tok,
                table: embed.matrix(Role::TokenEmbedding),
                wpe: learned.then(|| embed.vector(Role::PositionEmbedding).expect("wpe")),
                positions,
                shard: tp.map(|t| t.link.vocab.0 as usize),
            },
        );
        sum(residual.prefix(n * c));
        let norm = |w: Tensor, bias: Option<Tensor>, rows: usize, inp: Tensor, out: Tensor| {
            let kind = match self.design.norm {
                Norm::LayerNorm => NormKind::Layer {
                    mean: mean.expect("LayerNorm keeps a mean").prefix(rows),
                    bias: bias.expect("LayerNorm has a bias"),
                },
                Norm::RmsNorm => NormKind::Rms {
                    eps: self.config.norm_eps,
                },
            };
            let op = NormOp {
                out: out.prefix(rows * c),
                rstd: rstd.prefix(rows),
                inp: inp.prefix(rows * c),
                weight: w,
                kind,
                n: rows,
                c,
            };
            be.norm(a, &op);
        };
        let linear = |out: Tensor, inp: Tensor, w, bias, rows| {
            be.qlinear(
                a,
                &QLinear {
                    out,
                    inp,
                    weight: w,
                    bias,
                    n: rows,
                },
            );
        };
        let (nh, nkv, hd) = (s.n_heads as usize, s.n_kv_heads as usize, s.d_head as usize);
        let width = (nh + 2 * nkv) * hd;
        // Each row sees its prefix, or under a sliding window its last `window` positions.
        let rows_seeing = |window: usize| -> Vec<SeqRow> {
            owners
                .iter()
                .zip(positions)
                .map(|(id, &p)| SeqRow {
                    blocks: &self.blocks.seq(*id).blocks,
                    start: (p as usize + 1).saturating_sub(window),
                    len: p as usize + 1,
                })
                .collect()
        };
        let seq_rows = rows_seeing(usize::MAX);
        let windowed = s.sliding_window.map(|w| rows_seeing(w.window as usize));
        let partials = t(StepAct::Partials);
        for l in 0..s.n_layers {
            let w = &self.weights[unit_index(&self.units, UnitKind::Block(l))];
            let cache = self.caches[l as usize];
            norm(
                w.vector(Role::Norm1Weight).expect("norm1"),
                w.vector(Role::Norm1Bias),
                n,
                residual,
                ln,
            );
            if self.design.mla {
                let io = (ln, atty, proj);
                self.mla_attention(kind, w, cache.k, io, positions, slots, &seq_rows);
                sum(proj.prefix(n * c));
            } else {
                linear(
                    qkv,
                    ln,
                    w.matrix(Role::QkvWeight),
                    w.vector(Role::QkvBias),
                    n,
                );
                if self.design.positions == Positions::Rope {
                    let shape = RopeShape {
                        batch: 1,
                        seq: n,
                        heads: nh + nkv,
                        head_dim: hd,
                        row_width: width,
                        theta: self.config.rope_theta,
                    };
                    be.rope_at(a, qkv, positions, shape);
                }
                be.kv_write(a, &KvWrite { cache, qkv, slots });
                be.paged_attention(
                    a,
                    &PagedAttention {
                        out: atty,
                        qkv,
                        cache,
                        rows: match (&windowed, s.window_of(l)) {
                            (Some(w), Some(_)) => w,
                            _ => &seq_rows,
                        },
                        splits,
                        partials,
                    },
                );
                let attn_proj = w.matrix(Role::AttnProjWeight);
                let bias = w.vector(Role::AttnProjBias).filter(|_| lead);
                linear(proj, atty, attn_proj, bias, n);
                sum(proj.prefix(n * c));
            }
            be.residual_add(a, residual.prefix(n * c), proj.prefix(n * c));
            norm(
                w.vector(Role::Norm2Weight).expect("norm2"),
                w.vector(Role::Norm2Bias),
                n,
                residual,
                ln,
            );
            if self.is_moe(l) {
                self.moe_mlp(kind, w, n, ln, proj);
                sum(proj.prefix(n * c));
                be.residual_add(a, residual.prefix(n * c), proj.prefix(n * c));
                continue;
            }
            let fc = w.matrix(Role::FcWeight);
            linear(fch, ln, fc, w.vector(Role::FcBias), n);
            let f = s.d_ff as usize;
            be.activation(
                a,
                &Activation {
                    out: fch_act.prefix(n * f),
                    inp: fch.prefix(n * fc.rows),
                    kind: self.design.mlp,
                    n,
                    width: f,
                },
            );
            let down = w.matrix(Role::FcProjWeight);
            linear(
                proj,
                fch_act,
                down,
                w.vector(Role::FcProjBias).filter(|_| lead),
                n,
            );
            sum(proj.prefix(n * c));
            be.residual_add(a, residual.prefix(n * c), proj.prefix(n * c));
        }
        let head = &self.weights[unit_index(&self.units, UnitKind::Head)];
        norm(
            head.vector(Role::FinalNormWeight).expect("final norm"),
            head.vector(Role::FinalNormBias),
            n,
            residual,
            ln,
        );
        let lm = if s.tied_embeddings {
            embed.matrix(Role::TokenEmbedding)
        } else {
            head.matrix(Role::LmHead)
        };
        let rows = logit_rows.min(n);
        if rows == 0 {
            return;
        }
        let out = get(StepAct::Logits).prefix(rows * v);
        linear(out, ln.slice((n - rows) * c..n * c), lm, None, rows);
        match tp {
            Some(t) => t.gather_logits(a, out, rows, logits),
            None => {
                logits.resize(rows * v, 0.0);
                be.download(a, out, logits);
            }
        }
    }
}
