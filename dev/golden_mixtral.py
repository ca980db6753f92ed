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
    total = ce + CONFIG["router_aux_loss_coef"] * aux
    return logits, ce, total, {"balance_loss": repr(aux.item())}


if __name__ == "__main__":
    seed = 45
    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(**CONFIG, attn_implementation="eager")).float().train()
    gc.write(model, json.dumps(CONFIG), PATH, seed, rename=on_disk, objective=objective)
