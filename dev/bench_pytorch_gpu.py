"""PyTorch baselines on a GPU for `dev/gpu_check.sh`: HF GPT-2 124M (or the config.json given),
bf16 autocast with fp32 weights and fused AdamW (the amp recipe), B16 T1024 by default, random
token ids; eager and `torch.compile` in the same process, each after two untimed warm-up steps.
Prints one JSON line: {"eager": {"tokens_per_s", "peak_allocated_bytes"}, "compile": {...}}.

Example: python3 dev/bench_pytorch_gpu.py --config run/config.json --batch 16 --seq 1024 --steps 10
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config


def run(model, batch, seq, steps, vocab):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    x = torch.randint(0, vocab, (batch, seq), device="cuda")
    y = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"tokens_per_s": batch * seq * steps / seconds,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=None, help="a config.json; default HF GPT-2 124M")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(a.config) if a.config else GPT2Config()
    vocab = min(config.vocab_size, 50257)
    out = {}
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda().train()
    out["eager"] = run(model, a.batch, a.seq, a.steps, vocab)
    if not a.no_compile:
        out["compile"] = run(torch.compile(model), a.batch, a.seq, a.steps, vocab)
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
