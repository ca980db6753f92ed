"""Golden blocks for `crates/gguf`: random blocks of each ggml type the reader takes, dequantized
by the `gguf` Python package (llama.cpp's own gguf-py), written to
crates/gguf/tests/data/golden.json as hex bytes in and f32 bit patterns out.

    python3 -m venv venv && venv/bin/pip install gguf numpy
    venv/bin/python dev/golden_gguf.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# (type, bytes per block, offsets of the f16 scale fields, which get sane values)
TYPES = [
    (T.F16, 2, []),
    (T.BF16, 2, []),
    (T.Q4_0, 18, [0]),
    (T.Q4_1, 20, [0, 2]),
    (T.Q5_0, 22, [0]),
    (T.Q5_1, 24, [0, 2]),
    (T.Q8_0, 34, [0]),
    (T.Q4_K, 144, [0, 2]),
    (T.Q5_K, 176, [0, 2]),
    (T.Q6_K, 210, [208]),
]

rng = np.random.default_rng(20261204)
out = []
for qtype, block_bytes, scales in TYPES:
    blocks = 64 if block_bytes <= 2 else 3
    raw = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    for b in range(blocks):
        for at in scales:
            value = np.float16(rng.uniform(-0.1, 0.1) if at else rng.uniform(0.001, 0.05))
            raw[b, at:at + 2] = np.frombuffer(value.tobytes(), dtype=np.uint8)
    if qtype in (T.F16, T.BF16):
        # Finite halves only (exponent field not all ones).
        raw[:, 1] &= 0xBF if qtype == T.F16 else 0x7F
    values = quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    out.append({
        "type": qtype.name,
        "bytes": raw.tobytes().hex(),
        "f32_bits": values.view(np.uint32).tolist(),
    })

path = pathlib.Path(__file__).resolve().parent.parent / "crates/gguf/tests/data/golden.json"
path.write_text(json.dumps(out) + "\n")
print(f"wrote {path}: {len(out)} types")
