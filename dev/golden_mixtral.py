"""Writes crates/engine/tests/data/golden_mixtral.safetensors: a tiny Mixtral (Llama attention,
GQA 4 query / 2 kv heads, a sparse MoE MLP of 4 SwiGLU experts, top 2) in HF transformers, fp32,
CPU, fixed seed, with inputs, logits, loss, every gradient and a 10-step AdamW trajectory, as
dev/golden_common.py writes them, plus the load-balancing loss.

The objective is HF's with output_router_logits=True: cross-entropy + router_aux_loss_coef x
load_balancing_loss_func(router logits of every layer); the gradients and the trajectory's
steps are of that sum, the recorded loss and trajectory are the cross-entropy alone (what the
engine reports), and `balance_loss` in the metadata is the auxiliary loss of the first batch.
Tensors are named as save_pretrained writes them (block_sparse_moe.experts.{e}.w1/w2/w3), not
as transformers 5 holds them in memory (3-D gate_up_proj/down_proj).
Run from the repository root: python3 dev/golden_mixtral.py."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402

CONFIG = {
    "model_type": "mixtral", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "num_local_experts": 4,
    "num_experts_per_tok": 2, "output_router_logits": True, "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0, "sliding_window": None,
}
PATH = "crates/engine/tests/data/golden_mixtral.safetensors"


def on_disk(named):
    """In-memory parameters (or gradients) under their save_pretrained names."""
    out = {}
    f = CONFIG["intermediate_size"]
    for name, t in named.items():
        if ".mlp.experts.gate_up_proj" in name:
            base = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.w1.weight"] = t[e, :f].clone()
                out[f"{base}.{e}.w3.weight"] = t[e, f:].clone()
        elif ".mlp.experts.down_proj" in name:
            base = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.w2.weight"] = t[e].clone()
        else:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t.clone()
    return out


def objective(model, tokens, targets):
    out = model(input_ids=tokens, output_router_logits=True)
    logits = out.logits
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    aux = load_balancing_loss_func(out.router_logits, CONFIG["num_local_experts"],
                                   CONFIG["num_experts_per_tok"])
    return logits, ce, aux, ce + CONFIG["router_aux_loss_coef"] * aux


if __name__ == "__main__":
    seed = 45
    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(**CONFIG, attn_implementation="eager")).float().train()
    torch.manual_seed(seed)
    vocab = CONFIG["vocab_size"]
    tokens = torch.randint(0, vocab, (gc.BATCH, gc.SEQ))
    targets = torch.randint(0, vocab, (gc.BATCH, gc.SEQ))
    gc.perturb(model, seed + 1)
    named = dict(model.named_parameters())
    out = {"input.tokens": tokens.to(torch.int32), "input.targets": targets.to(torch.int32)}
    for name, t in on_disk({n: p.detach() for n, p in named.items()}).items():
        out["weights." + name] = t

    logits, ce, aux, total = objective(model, tokens, targets)
    total.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = ce.detach().reshape(1)
    for name, t in on_disk({n: p.grad.detach() for n, p in named.items()}).items():
        out["grad." + name] = t
    model.zero_grad()

    decay = [p for p in named.values() if p.dim() >= 2]
    no_decay = [p for p in named.values() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": gc.WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=gc.LR, betas=gc.BETAS, eps=gc.EPS,
    )
    trajectory = []
    for _ in range(gc.STEPS):
        opt.zero_grad()
        _, step_ce, _, step_total = objective(model, tokens, targets)
        step_total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), gc.CLIP)
        opt.step()
        trajectory.append(step_ce.item())
    out["trajectory"] = torch.tensor(trajectory)
    meta = {
        "magic": gc.MAGIC, "version": gc.VERSION, "config": json.dumps(CONFIG),
        "batch": str(gc.BATCH), "seq": str(gc.SEQ),
        "optimizer": json.dumps({"lr": gc.LR, "betas": gc.BETAS, "eps": gc.EPS,
                                 "weight_decay": gc.WEIGHT_DECAY, "clip": gc.CLIP}),
        "balance_loss": repr(aux.item()),
    }
    save_file({k: v.contiguous() for k, v in out.items()}, PATH, metadata=meta)
    print(f"wrote {PATH}: loss {ce.item():.6f}, balance loss {aux.item():.6f}, "
          f"trajectory {trajectory[0]:.4f} -> {trajectory[-1]:.4f}")
