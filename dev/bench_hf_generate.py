"""HF transformers baseline for `frugal bench generate --baseline hf`: the same model shape (built
from the config.json frugal writes, random weights: only speed is compared) decoding with its KV
cache (`use_cache=True`, greedy, PyTorch CPU) at the same batch, prompt length and new tokens, in
fp32 or bf16 as frugal's `--weights f32|bf16`.

Times `model.generate` for the prompt plus N new tokens and, separately, the prompt alone, so the
decode rate is N / (t_total - t_prefill). Prints one JSON line: {"decode_tokens_per_s": ...,
"prefill_tokens_per_s": ...}.

Example: python3 dev/bench_hf_generate.py --config DIR/config.json --dtype bf16 --batch 1 \
    --prompt-len 32 --new-tokens 16 --threads 2
"""

import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    config = AutoConfig.from_pretrained(a.config)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation="sdpa")
    model.eval()
    vocab = min(config.vocab_size, 50257)
    x = torch.randint(3, vocab, (a.batch, a.prompt_len))
    kw = dict(do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)

    def run(n):
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        return time.perf_counter() - t0

    run(2)  # warm-up
    prefill = run(1)
    total = run(a.new_tokens + 1)
    decode = max(total - prefill, 1e-9)
    print(json.dumps({
        "decode_tokens_per_s": a.batch * a.new_tokens / decode,
        "prefill_tokens_per_s": a.batch * a.prompt_len / prefill,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
