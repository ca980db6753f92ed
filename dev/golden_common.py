"""Shared writer of the engine's golden files (llm.c's test_gpt2 idea, for frugal).

A golden file is safetensors with a JSON header in its metadata:
  magic "frugal-golden", version "1", the HF config.json, batch, seq and the optimizer settings;
tensors:
  input.tokens, input.targets (int32, (B, T)), weights.<hf name> (the initial weights),
  logits (B, T, V), loss (1), grad.<hf name> (every parameter's gradient of the mean loss),
  trajectory (10): the loss before each of 10 AdamW steps on the same batch.
The Rust tests in crates/train/tests/golden.rs and crates/infer/tests/golden.rs load the weights and compare everything else.
"""

import json

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

MAGIC = "frugal-golden"
VERSION = "1"
BATCH, SEQ = 2, 16
# AdamW as the engine's default (nanoGPT's): decay only on tensors with dim >= 2.
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
STEPS = 10


def perturb(model, seed):
    """HF init leaves biases at 0 and norm weights at 1, which would hide a misplaced bias or
    norm weight: add small noise to every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def write(model, config_json, path, seed, rename=None, objective=None, prepare=None):
    """Writes the golden file of `model`. Hooks for families whose tensors or objective differ:
    `rename(named)` maps in-memory tensors to the names save_pretrained writes; `objective(model,
    tokens, targets)` returns (logits, reported loss, loss to differentiate, metadata); `prepare`
    runs on the model after the perturbation (before the weights are recorded)."""
    rename = rename or (lambda named: dict(named))

    def plain(m, x, y):
        logits, loss = loss_of(m, x, y)
        return logits, loss, loss, {}

    objective = objective or plain
    torch.manual_seed(seed)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (BATCH, SEQ))
    targets = torch.randint(0, vocab, (BATCH, SEQ))
    perturb(model, seed + 1)
    if prepare:
        prepare(model)
    named = dict(model.named_parameters())
    out = {"input.tokens": tokens.to(torch.int32), "input.targets": targets.to(torch.int32)}
    for name, t in rename({n: p.detach() for n, p in named.items()}).items():
        out["weights." + name] = t.clone()

    logits, loss, total, extra = objective(model, tokens, targets)
    total.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1)
    first_loss = loss.item()
    for name, t in rename({n: p.grad.detach() for n, p in named.items()}).items():
        out["grad." + name] = t.clone()
    model.zero_grad()

    decay = [p for p in named.values() if p.dim() >= 2]
    no_decay = [p for p in named.values() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    trajectory = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, step_loss, step_total, _ = objective(model, tokens, targets)
        step_total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        trajectory.append(step_loss.item())
    out["trajectory"] = torch.tensor(trajectory)

    meta = {
        "magic": MAGIC,
        "version": VERSION,
        "config": config_json,
        "batch": str(BATCH),
        "seq": str(SEQ),
        "optimizer": json.dumps({"lr": LR, "betas": BETAS, "eps": EPS,
                                 "weight_decay": WEIGHT_DECAY, "clip": CLIP}),
        **extra,
    }
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}: loss {first_loss:.6f}, trajectory {trajectory[0]:.4f} -> {trajectory[-1]:.4f}")
