//! A sequence's KV cache as bytes, out of one worker and into another: what prefill/decode
//! disaggregation ships from the worker that ran the prompt to the one that decodes it (vLLM's
//! KV connector, DistServe's transfer). The bytes are every layer's keys, then its values (one
//! latent side under latent attention), block by block in the sequence's order, each block's
//! codes then its scales: exactly `blocks × ServeSetup::block_bytes` of the model, the plan's
//! figure for a request's KV.
//!
//! Blocks a sliding window has released are not shipped; the receiver releases the same ones.
//!
//! Example: `a.export_kv(seq, &mut bytes); let there = b.import_kv(a.seq_len(seq), &bytes)?;`.

use super::blocks::{SeqId, FREED};
use super::Worker;
use engine::backend::{InferOps, Tensor};
use engine::error::EngineError;

impl<B: InferOps> Worker<B> {
    /// Bytes the KV of `blocks` live blocks ships as.
    pub fn kv_ship_bytes(&self, blocks: usize) -> u64 {
        blocks as u64 * self.block_bytes()
    }

    /// Calls `f(tensor)` for every piece of block `b`'s KV in one layer's cache, in the shipping
    /// order.
    fn block_pieces(&self, layer: usize, b: usize, mut f: impl FnMut(Tensor)) {
        let c = &self.caches[layer];
        let n = c.n_kv_heads * c.block;
        let latent = self.config.shape.mla.is_some();
        let sides = [(c.k, c.k_scales), (c.v, c.v_scales)];
        for (codes, scales) in sides.into_iter().take(if latent { 1 } else { 2 }) {
            f(codes.slice(b * n * c.head_dim..(b + 1) * n * c.head_dim));
            if let Some(s) = scales {
                f(s.slice(b * n..(b + 1) * n));
            }
        }
    }

    /// The live blocks of `id`, in order.
    fn live_blocks(&self, id: SeqId) -> Vec<usize> {
        let seq = self.blocks.seq(id);
        seq.blocks
            .iter()
            .filter(|&&b| b != FREED)
            .map(|&b| b as usize)
            .collect()
    }

    /// Appends the KV of `id` to `out` (see the module docs for the layout).
    pub fn export_kv(&self, id: SeqId, out: &mut Vec<u8>) {
        let be = self.arena.backend();
        let blocks = self.live_blocks(id);
        out.reserve(self.kv_ship_bytes(blocks.len()) as usize);
        for layer in 0..self.caches.len() {
            for &b in &blocks {
                self.block_pieces(layer, b, |t| {
                    let at = out.len();
                    out.resize(at + t.len * t.dtype.size_bytes(), 0);
                    be.download_bytes(&self.arena, t, &mut out[at..]);
                });
            }
        }
    }

    /// A new sequence of `len` tokens whose KV is `bytes` (from [`Worker::export_kv`] of a
    /// worker of the same model and KV format); refused, changing nothing, when the context, the
    /// pool or the byte count does not fit.
    pub fn import_kv(&mut self, len: usize, bytes: &[u8]) -> Result<SeqId, EngineError> {
        if len == 0 || len as u64 > self.setup.context {
            return Err(EngineError::Infer(format!(
                "a shipped sequence of {len} tokens; this worker holds 1 to {}",
                self.setup.context
            )));
        }
        let id = self.new_sequence();
        if let Err(e) = self.check_room(&[id], len) {
            self.free(id);
            return Err(e);
        }
        let chunk = self.setup.prefill_chunk as usize;
        let (mut slots, mut copies) = (Vec::new(), Vec::new());
        let mut done = 0;
        // Grown as the prefill grew it, so a sliding window releases the same blocks.
        while done < len {
            let n = chunk.min(len - done);
            self.blocks.grow(id, n, &mut slots, &mut copies);
            self.blocks.release_outside_window(id);
            done += n;
        }
        let blocks = self.live_blocks(id);
        let want = self.kv_ship_bytes(blocks.len());
        if bytes.len() as u64 != want {
            self.free(id);
            return Err(EngineError::Infer(format!(
                "{} bytes of KV shipped for {len} tokens; this worker's {} blocks hold {want}",
                bytes.len(),
                blocks.len()
            )));
        }
        let be = self.arena.backend();
        let mut at = 0;
        for layer in 0..self.caches.len() {
            for &b in &blocks {
                self.block_pieces(layer, b, |t| {
                    let n = t.len * t.dtype.size_bytes();
                    be.upload_bytes(&self.arena, t, &bytes[at..at + n]);
                    at += n;
                });
            }
        }
        Ok(id)
    }
}
