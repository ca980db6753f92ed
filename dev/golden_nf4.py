"""Writes crates/formats/tests/data/golden_nf4.safetensors: bitsandbytes' NF4 storage of a seeded
tensor (blocks of 64), with and without double quantization, for frugal's bitsandbytes-exact NF4
(`formats::bnb`). The tensor has a remainder block (its length is not a multiple of 64) and a few
large outliers so that blocks' absmax values spread. Tensors:
  input (f32), packed (u8, two codes per byte, high nibble first), absmax (f32 per block),
  dq.packed, dq.absmax (u8 per block), dq.offset (f32, 1), dq.absmax2 (f32 per 256 blocks),
  dq.code (f32, 256: the dynamic map that quantizes the absmax).
Run from the repository root: python3 dev/golden_nf4.py (needs torch and bitsandbytes)."""

import torch
import bitsandbytes.functional as F
from safetensors.torch import save_file

if __name__ == "__main__":
    g = torch.Generator().manual_seed(41)
    n = 64 * 600 + 37
    x = torch.randn(n, generator=g) * 0.02
    x[::997] *= 40.0
    q, s = F.quantize_4bit(x, blocksize=64, compress_statistics=False, quant_type="nf4")
    dq, ds = F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    out = {
        "input": x.contiguous(),
        "packed": q.reshape(-1).contiguous(),
        "absmax": s.absmax.float().contiguous(),
        "dq.packed": dq.reshape(-1).contiguous(),
        "dq.absmax": ds.absmax.reshape(-1).contiguous(),
        "dq.offset": ds.offset.reshape(1).float().contiguous(),
        "dq.absmax2": ds.state2.absmax.float().contiguous(),
        "dq.code": ds.state2.code.float().contiguous(),
    }
    save_file(out, "crates/formats/tests/data/golden_nf4.safetensors")
    print({k: (tuple(v.shape), str(v.dtype)) for k, v in out.items()})
