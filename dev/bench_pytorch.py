"""PyTorch baseline for `frugal bench train --baseline pytorch`: the same model (HF transformers,
built from the config.json frugal writes), fp32 on CPU, the same step (forward, cross-entropy over
all tokens, backward, gradient clipping at 1.0, AdamW), random token ids, one untimed warm-up step.
Prints one JSON line: {"tokens_per_s": ..., "step_seconds": ...}.

Example: python3 dev/bench_pytorch.py --config config.json --batch 4 --seq 256 --steps 5 --threads 2
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(a.config)
    # SDPA is PyTorch's fastest attention on CPU; dropout is off in the config.
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    vocab = min(config.vocab_size, 50257)
    x = torch.randint(0, vocab, (a.batch, a.seq))
    y = torch.randint(0, vocab, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - start
    print(json.dumps({"tokens_per_s": a.batch * a.seq * a.steps / seconds,
                      "step_seconds": seconds / a.steps}))


if __name__ == "__main__":
    main()
