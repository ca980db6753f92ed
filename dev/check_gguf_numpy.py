"""An independent f64 reference for a llama GGUF: the `gguf` package's dequantizer, ggml's
interleaved RoPE on the file's own q/k rows (no reordering), and the Llama block in numpy.
Prints greedy continuations of the prompts dev/golden_smollm2.py uses and, for each, the first
token where `frugal generate --weights f32` differs, plus the largest logit difference at the last
prompt position (frugal's logits via `frugal generate --json --max-new-tokens 1` are not
exposed, so the comparison is on tokens).

    venv/bin/pip install gguf numpy
    venv/bin/python dev/check_gguf_numpy.py path/to/model.gguf target/release/frugal
"""
import json
import subprocess
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = ["The capital of France is", "ROMEO:", "def fibonacci(n):", "Once upon a time",
           "The three primary colors are"]
NEW = 48


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v[0] if len(v) == 1 else v


def main(path, frugal):
    r = GGUFReader(path)
    t = {x.name: x for x in r.tensors}

    def w(name):
        x = t[name]
        return dequantize(x.data, x.tensor_type).astype(np.float64).reshape(
            [int(d) for d in reversed(x.shape)])

    n_layer = int(field(r, "llama.block_count"))
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    base = float(field(r, "llama.rope.freq_base"))
    embed = w("token_embd.weight")
    out_w = w("output.weight") if "output.weight" in t else embed
    layers = [{k: w(f"blk.{i}.{k}.weight") for k in
               ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                "ffn_up", "ffn_down"]} for i in range(n_layer)]
    norm = w("output_norm.weight")
    d = embed.shape[1]
    hd = d // n_head

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x, pos):  # ggml NORM mode: pairs (2i, 2i+1)
        i = np.arange(hd // 2)
        theta = pos[:, None] * base ** (-2.0 * i / hd)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(ids):
        n = len(ids)
        x = embed[ids]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for L in layers:
            h = rms(x, L["attn_norm"])
            q = rope((h @ L["attn_q"].T).reshape(n, n_head, hd), pos)
            k = rope((h @ L["attn_k"].T).reshape(n, n_kv, hd), pos)
            v = (h @ L["attn_v"].T).reshape(n, n_kv, hd)
            rep = n_head // n_kv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            a = np.einsum("hqk,khd->qhd", p, v).reshape(n, d)
            x = x + a @ L["attn_output"].T
            h = rms(x, L["ffn_norm"])
            g = h @ L["ffn_gate"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return rms(x, norm) @ out_w.T

    eos = int(field(r, "tokenizer.ggml.eos_token_id"))
    for prompt in PROMPTS:
        run = subprocess.run([frugal, "generate", "--model", path, "--prompt", prompt,
                              "--max-new-tokens", str(NEW), "--weights", "f32", "--json"], capture_output=True,
                             text=True, check=True)
        ours = json.loads(run.stdout)
        ids = list(ours["prompt_token_ids"])
        ref = []
        for _ in range(NEW):
            nxt = int(forward(ids + ref)[-1].argmax())
            if nxt == eos:
                break
            ref.append(nxt)
        same = next((i for i, (a, b) in enumerate(zip(ours["tokens"], ref)) if a != b),
                    min(len(ours["tokens"]), len(ref)))
        print(f"{prompt!r}: frugal and the f64 reference agree on {same} of "
              f"{len(ref)} reference tokens ({len(ours['tokens'])} from frugal)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
