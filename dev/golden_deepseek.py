"""Writes crates/engine/tests/data/golden_deepseek{,_lite}.safetensors: tiny DeepSeek-V2 models in
HF transformers, fp32, CPU, fixed seed, with inputs, logits, loss, every gradient and a 10-step
AdamW trajectory as dev/golden_common.py writes them.

- golden_deepseek: multi-head latent attention with a query bottleneck (q_lora_rank 24), a dense
  first layer (first_k_dense_replace 1), then 4 routed experts (top 2, greedy, gates x 1.5) and
  2 shared experts.
- golden_deepseek_lite: V2-Lite's shape of attention (queries projected directly) with
  group-limited routing (2 groups, 1 kept), 1 shared expert, every layer MoE.

Tensors are named as save_pretrained writes them (mlp.experts.{e}.gate_proj/up_proj/down_proj),
not as transformers 5 holds them in memory (3-D gate_up_proj/down_proj).
Run from the repository root: python3 dev/golden_deepseek.py."""

import json
import os
import sys

import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402

BASE = {
    "model_type": "deepseek_v2", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "kv_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "norm_topk_prob": False,
    "attention_bias": False,
}
CASES = {
    "golden_deepseek": dict(BASE, q_lora_rank=24, first_k_dense_replace=1, n_shared_experts=2,
                            routed_scaling_factor=1.5, topk_method="greedy"),
    "golden_deepseek_lite": dict(BASE, q_lora_rank=None, first_k_dense_replace=0,
                                 n_shared_experts=1, routed_scaling_factor=1.0,
                                 topk_method="group_limited_greedy", n_group=2, topk_group=1),
}


def on_disk(named, f):
    out = {}
    for name, t in named.items():
        if ".mlp.experts.gate_up_proj" in name:
            base = name.replace(".gate_up_proj", "")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = t[e, :f].clone()
                out[f"{base}.{e}.up_proj.weight"] = t[e, f:].clone()
        elif ".mlp.experts.down_proj" in name:
            base = name.replace(".down_proj", "")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t.clone()
    return out


def write(name, config, seed):
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(DeepseekV2Config(**config, attn_implementation="eager")).float()
    model.train()

    def route(m):
        # HF starts the router at zero (every expert ties): random weights break the ties.
        with torch.no_grad():
            for layer in m.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is not None:
                    gate.weight.normal_(0.0, 0.5)

    f = config["moe_intermediate_size"]
    path = f"crates/engine/tests/data/{name}.safetensors"
    gc.write(model, json.dumps(config), path, seed, rename=lambda t: on_disk(t, f), prepare=route)


if __name__ == "__main__":
    for i, (name, config) in enumerate(CASES.items()):
        write(name, config, seed=46 + i)
