//! Element counts of the tensors a transformer block saves (`plan::tensors::BlockTensor`) for a
//! block's dimensions.
//!
//! Example: `dims.numel(BlockTensor::Qkv, Attention::Flash)` is N·(NH + 2 NKV)·HD.

use super::BlockDims;
use plan::setup::Attention;
pub use plan::tensors::BlockTensor;

impl BlockDims {
    /// Elements of this tensor, or `None` when the model or the attention kernel has none.
    pub fn numel(&self, t: BlockTensor, attention: Attention) -> Option<u64> {
        let d = self;
        let flash = attention == Attention::Flash;
        let numel = match t {
            // The norms' region: this rank's rows under sequence parallelism.
            BlockTensor::Ln1 | BlockTensor::Res2 | BlockTensor::Ln2 => d.local * d.c,
            BlockTensor::Ln1Rstd | BlockTensor::Ln2Rstd => d.local,
            BlockTensor::Ln1Mean | BlockTensor::Ln2Mean if d.has_mean => d.local,
            BlockTensor::Ln1Mean | BlockTensor::Ln2Mean => return None,
            BlockTensor::Qkv => d.n * d.qkv,
            BlockTensor::Att if !flash => d.att,
            BlockTensor::Lse if flash => d.lse,
            BlockTensor::Att | BlockTensor::Lse => return None,
            BlockTensor::Atty => d.n * d.atty,
            BlockTensor::Fch => d.routed() * d.fc,
            BlockTensor::FchAct => d.routed() * d.fc_act,
            BlockTensor::Probs | BlockTensor::Route | BlockTensor::Gates if d.experts == 0 => {
                return None
            }
            BlockTensor::Probs => d.n * d.experts,
            BlockTensor::Route => d.route_len(),
            BlockTensor::Gates => d.routed(),
            BlockTensor::SharedFch | BlockTensor::SharedFchAct if d.shared == 0 => return None,
            BlockTensor::SharedFch => d.n * 2 * d.shared,
            BlockTensor::SharedFchAct => d.n * d.shared,
            mla_tensor => {
                let a = d.mla?;
                match mla_tensor {
                    BlockTensor::Qa | BlockTensor::QaNorm => d.n * a.q_rank?,
                    BlockTensor::QaRstd => {
                        a.q_rank?;
                        d.n
                    }
                    BlockTensor::KvLatent | BlockTensor::KvNorm => d.n * a.kv_rank,
                    BlockTensor::KvRstd => d.n,
                    _ => d.n * a.heads * a.qk(),
                }
            }
        };
        Some(numel)
    }
}
