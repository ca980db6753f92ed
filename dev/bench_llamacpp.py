"""llama.cpp baseline for `frugal bench generate`: the same random weights, written as a GGUF file,
decoded by llama.cpp (llama-cpp-python, built from source with GGML_NATIVE) on the same threads.

Reads a folder `frugal bench generate --save DIR` wrote (config.json + weights.frugal) and writes
DIR/model.gguf. int4 (symmetric, groups of 32) is llama.cpp's Q4_0 byte for byte: frugal's
sub-block nibble order is Q4_0's `qs`, and both decode as scale × (q − 8); int8 (a scale a row)
becomes Q8_0 with each block taking its row's scale (the same values, 6% more bytes); bf16 and
f32 are copied.
Fused q|k|v and gate|up rows are split into llama.cpp's tensors. The vocabulary is placeholder
tokens (the weights are random: only speed is compared, not text).

With --batch B, B sequences decode together, one token each per llama_decode call (each prompt
prefilled on its own, as `frugal bench generate` does), and decode_tokens_per_s is B over the
median step.

Prints one JSON line: {"decode_tokens_per_s": ..., "prefill_tokens_per_s": ..., "gguf_type": ...}.

Example:
  frugal bench generate --model llama2-7b --weights int4 --save /tmp/q7b
  python3 dev/bench_llamacpp.py --dir /tmp/q7b --prompt-len 32 --new-tokens 16 --threads 2
"""

import argparse
import json
import os
import struct
import time

import numpy as np


def read_frugal(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"FRUGALQ1", "not a frugal quantized file"
        (length,) = struct.unpack("<Q", f.read(8))
        f.read(4)
        header = json.loads(f.read(length))
        offset = 20 + length
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset)
    tensors, at = {}, 0
    for t in header["tensors"]:
        tensors[t["name"]] = data[at : at + t["bytes"]]
        at += t["bytes"]
    return header, tensors


def q4_0(codes, scales, rows, cols):
    """Q4_0 blocks (f16 scale, 16 bytes of nibbles) from frugal's int4 g32 codes and scales."""
    blocks = rows * cols // 32
    out = np.empty((blocks, 18), dtype=np.uint8)
    out[:, :2] = np.asarray(scales).view(np.uint8).reshape(blocks, 2)
    out[:, 2:] = np.asarray(codes).reshape(blocks, 16)
    return out.reshape(rows, cols // 32 * 18)


def q8_0(codes, row_scales, rows, cols):
    """Q8_0 blocks (f16 scale, 32 int8 codes) from frugal's int8 codes, each block taking its
    row's scale: the same values, 34 bytes per 32 weights against frugal's 32 (+ 2 a row)."""
    per_row = cols // 32
    out = np.empty((rows, per_row, 34), dtype=np.uint8)
    scale_bytes = np.asarray(row_scales).view(np.uint8).reshape(rows, 1, 2)
    out[:, :, :2] = np.repeat(scale_bytes, per_row, axis=1)
    out[:, :, 2:] = np.asarray(codes).view(np.uint8).reshape(rows, per_row, 32)
    return out.reshape(rows, per_row * 34)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    if a.batch < 1:
        raise SystemExit("--batch must be at least 1")
    import gguf

    header, t = read_frugal(os.path.join(a.dir, "weights.frugal"))
    cfg = json.loads(header["config"])
    fmt, group = header["weights"], header["group"]
    if fmt == "int4":
        assert group == 32, "Q4_0 is int4 with groups of 32"
    elif fmt not in ("int8", "bf16", "f32"):
        raise SystemExit(f"{fmt}: this script writes int4 g32 (Q4_0), int8 (Q8_0), bf16 or f32")
    c, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, f, v = c // nh, cfg["intermediate_size"], cfg["vocab_size"]
    out_path = os.path.join(a.dir, "model.gguf")
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(c)
    w.add_block_count(L)
    w.add_feed_forward_length(f)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(v)])
    w.add_token_scores([0.0] * v)
    w.add_token_types([1] * v)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def matrix(name, unit, role, rows, cols, r0=0, r1=None):
        r1 = rows if r1 is None else r1
        codes = t[f"weights.{unit}.{role}"]
        if fmt == "int4":
            per_row = cols // 2
            scales = t[f"weights.{unit}.{role}.scales"]
            sc = np.asarray(scales).view(np.uint8).reshape(rows, cols // 32 * 2)
            cd = np.asarray(codes).reshape(rows, per_row)
            data = q4_0(cd[r0:r1].copy(), sc[r0:r1].copy().view(np.float16), r1 - r0, cols)
            w.add_tensor(name, data, raw_shape=[r1 - r0, cols // 32 * 18], raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        elif fmt == "int8":
            sc = np.asarray(t[f"weights.{unit}.{role}.scales"]).view(np.float16).reshape(rows)
            cd = np.asarray(codes).view(np.int8).reshape(rows, cols)
            data = q8_0(cd[r0:r1].copy(), sc[r0:r1].copy(), r1 - r0, cols)
            w.add_tensor(name, data, raw_shape=[r1 - r0, cols // 32 * 34], raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif fmt == "bf16":
            # Raw bytes: the writer reads a uint8 array's shape as bytes of the stated type.
            data = np.asarray(codes).reshape(rows, cols * 2)[r0:r1].copy()
            w.add_tensor(name, data, raw_shape=[r1 - r0, cols * 2], raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            data = np.asarray(codes).view(np.float32).reshape(rows, cols)[r0:r1].copy()
            w.add_tensor(name, data)

    def vectors(unit, sizes):
        vec = np.asarray(t[f"weights.{unit}.vectors"]).view(np.float32)
        out, at = [], 0
        for n in sizes:
            out.append(vec[at : at + n].copy())
            at += n
        return out

    matrix("token_embd.weight", "embed", "wte", v, c)
    q, kv = nh * hd, nkv * hd
    for l in range(L):
        u = f"h.{l}"
        ln1, ln2 = vectors(u, [c, c])
        w.add_tensor(f"blk.{l}.attn_norm.weight", ln1)
        matrix(f"blk.{l}.attn_q.weight", u, "qkv_w", q + 2 * kv, c, 0, q)
        matrix(f"blk.{l}.attn_k.weight", u, "qkv_w", q + 2 * kv, c, q, q + kv)
        matrix(f"blk.{l}.attn_v.weight", u, "qkv_w", q + 2 * kv, c, q + kv, q + 2 * kv)
        matrix(f"blk.{l}.attn_output.weight", u, "attn_proj_w", c, q)
        w.add_tensor(f"blk.{l}.ffn_norm.weight", ln2)
        matrix(f"blk.{l}.ffn_gate.weight", u, "fc_w", 2 * f, c, 0, f)
        matrix(f"blk.{l}.ffn_up.weight", u, "fc_w", 2 * f, c, f, 2 * f)
        matrix(f"blk.{l}.ffn_down.weight", u, "fc_proj_w", c, f)
    (lnf,) = vectors("head", [c])
    w.add_tensor("output_norm.weight", lnf)
    if "weights.head.lm_head" in t:
        matrix("output.weight", "head", "lm_head", v, c)
    # Tied embeddings: without output.weight llama.cpp multiplies by token_embd, as frugal does.
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    import llama_cpp

    if a.batch > 1:
        decode_tps, prefill_tps = batched(out_path, a, v)
        print(json.dumps({
            "decode_tokens_per_s": decode_tps,
            "decode_step_s": a.batch / decode_tps,
            "prefill_tokens_per_s": prefill_tps,
            "batch": a.batch,
            "gguf_type": {"int4": "Q4_0", "int8": "Q8_0", "bf16": "BF16", "f32": "F32"}[fmt],
            "llama_cpp_python": llama_cpp.__version__,
        }))
        return
    llm = llama_cpp.Llama(
        model_path=out_path,
        n_ctx=a.prompt_len + a.new_tokens + 8,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=max(a.prompt_len, 8),
        verbose=False,
    )
    rng = np.random.default_rng(1)
    prompt = [int(x) for x in rng.integers(3, v, a.prompt_len)]
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t0
    steps = []
    for _ in range(a.new_tokens + 1):
        tok = int(rng.integers(3, v))
        t0 = time.perf_counter()
        llm.eval([tok])
        steps.append(time.perf_counter() - t0)
    steps = sorted(steps[1:])
    step = steps[len(steps) // 2]
    print(json.dumps({
        "decode_tokens_per_s": 1.0 / step,
        "decode_step_s": step,
        "prefill_tokens_per_s": a.prompt_len / prefill,
        "gguf_type": {"int4": "Q4_0", "int8": "Q8_0", "bf16": "BF16", "f32": "F32"}[fmt],
        "llama_cpp_python": llama_cpp.__version__,
    }))


def batched(path, a, vocab):
    """Aggregate decode tokens/s of a.batch sequences stepping together, and prefill tokens/s
    of their prompts (one llama_decode each), through llama.cpp's own batch API."""
    import llama_cpp as lc
    from llama_cpp import _internals as internals

    b, per_seq = a.batch, a.prompt_len + a.new_tokens + 8
    most = lc.llama_max_parallel_sequences()
    if b > most:
        raise SystemExit(f"--batch {b}: llama.cpp decodes at most {most} sequences together")
    model = internals.LlamaModel(path_model=path, params=lc.llama_model_default_params(), verbose=False)
    cp = lc.llama_context_default_params()
    cp.n_ctx = b * per_seq
    cp.n_seq_max = b
    cp.n_batch = cp.n_ubatch = max(a.prompt_len, b)
    cp.n_threads = cp.n_threads_batch = a.threads
    # One cache per sequence (llama.cpp's advice for sequences that share no prefix).
    cp.kv_unified = False
    # The attention of the batch-1 run (Llama's default): flash attention off.
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = internals.LlamaContext(model=model, params=cp, verbose=False)
    batch = internals.LlamaBatch(n_tokens=cp.n_batch, embd=0, n_seq_max=1, verbose=False)
    rng = np.random.default_rng(1)

    def fill(tokens, positions, seqs, last_only):
        """The batch; logits for every token, or (a prompt) for its last only, as Llama.eval."""
        bb = batch.batch
        for i, (t, p, s) in enumerate(zip(tokens, positions, seqs)):
            bb.token[i], bb.pos[i], bb.n_seq_id[i] = t, p, 1
            bb.logits[i] = not last_only or i == len(tokens) - 1
            bb.seq_id[i][0] = s
        bb.n_tokens = len(tokens)

    t0 = time.perf_counter()
    for s in range(b):
        prompt = [int(x) for x in rng.integers(3, vocab, a.prompt_len)]
        fill(prompt, range(a.prompt_len), [s] * a.prompt_len, True)
        ctx.decode(batch)
    prefill = time.perf_counter() - t0
    steps = []
    for i in range(a.new_tokens + 1):
        fill([int(x) for x in rng.integers(3, vocab, b)], [a.prompt_len + i] * b, range(b), False)
        t0 = time.perf_counter()
        ctx.decode(batch)
        steps.append(time.perf_counter() - t0)
    steps = sorted(steps[1:])
    return b / steps[len(steps) // 2], b * a.prompt_len / prefill


if __name__ == "__main__":
    main()
