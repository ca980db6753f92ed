"""Writes crates/engine/tests/data/golden_lora_{gpt2,llama}.safetensors: LoRA as PEFT runs it over a
tiny HF base (fp32, CPU, fixed seed), for crates/train/tests/lora_golden.rs.

The base is dev/golden_gpt2.py's / dev/golden_llama.py's tiny model with perturbed weights; PEFT's
LoraConfig(r=4, lora_alpha=8, no dropout) targets GPT-2's c_attn and c_proj (the fused q|k|v
Conv1D and both projections) or Llama's q_proj, v_proj, gate_proj and down_proj (parts of the
fused views). B is drawn at random instead of PEFT's zeros, so A's gradient is not zero. Saved:
input.tokens, input.targets, weights.<hf name> (the base), adapter.<PEFT name> (A and B as
`save_pretrained` names them), logits, loss, grad.<PEFT name> (each adapter's gradient of the
mean loss) and a 10-step AdamW trajectory (lr 1e-2, betas (0.9, 0.95), eps 1e-8, no weight decay,
clip 1.0) training only the adapters. Run from the repository root: python3 dev/golden_lora.py
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import BATCH, MAGIC, SEQ, VERSION, loss_of, perturb  # noqa: E402
from golden_gpt2 import CONFIG as GPT2  # noqa: E402
from golden_llama import CONFIG as LLAMA  # noqa: E402

RANK, ALPHA = 4, 8
LR, BETAS, EPS, CLIP, STEPS = 1e-2, (0.9, 0.95), 1e-8, 1.0, 10


def write(model, config, targets, path, seed):
    torch.manual_seed(seed)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (BATCH, SEQ))
    targets_ = torch.randint(0, vocab, (BATCH, SEQ))
    perturb(model, seed + 1)
    out = {"input.tokens": tokens.to(torch.int32), "input.targets": targets_.to(torch.int32)}
    for name, p in model.state_dict().items():
        if not name.endswith(".attn.bias") and not name.endswith("masked_bias"):
            out["weights." + name] = p.detach().clone()
    lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets,
                      fan_in_fan_out=config.get("model_type") == "gpt2")
    peft = get_peft_model(model, lora)
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    trainable = {n: p for n, p in peft.named_parameters() if p.requires_grad}

    def saved(name):
        # PEFT's save_pretrained drops the adapter name: `.lora_A.default.weight` -> `.lora_A.weight`.
        return name.replace(".default", "")

    for name, p in trainable.items():
        out["adapter." + saved(name)] = p.detach().clone()
    logits, loss = loss_of(peft, tokens, targets_)
    loss.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1)
    for name, p in trainable.items():
        out["grad." + saved(name)] = p.grad.detach().clone()
    peft.zero_grad()
    opt = torch.optim.AdamW(list(trainable.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    trajectory = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, loss = loss_of(peft, tokens, targets_)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(trainable.values()), CLIP)
        opt.step()
        trajectory.append(loss.item())
    out["trajectory"] = torch.tensor(trajectory)
    meta = {
        "magic": MAGIC, "version": VERSION, "config": json.dumps(config), "batch": str(BATCH),
        "seq": str(SEQ), "rank": str(RANK), "alpha": str(ALPHA), "targets": ",".join(targets),
        "optimizer": json.dumps({"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": 0.0,
                                 "clip": CLIP}),
    }
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}: loss {out['loss'].item():.6f}, trajectory {trajectory[0]:.4f} -> "
          f"{trajectory[-1]:.4f}, {len(trainable)} adapter tensors")


if __name__ == "__main__":
    torch.manual_seed(51)
    gpt2 = GPT2LMHeadModel(GPT2Config(**GPT2, attn_implementation="eager")).float().train()
    write(gpt2, GPT2, ["c_attn", "c_proj"], "crates/engine/tests/data/golden_lora_gpt2.safetensors", 51)
    torch.manual_seed(52)
    llama = LlamaForCausalLM(LlamaConfig(**LLAMA, attn_implementation="eager")).float().train()
    write(llama, LLAMA, ["q_proj", "v_proj", "gate_proj", "down_proj"],
          "crates/engine/tests/data/golden_lora_llama.safetensors", 52)
