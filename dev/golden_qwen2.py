"""Writes crates/engine/tests/data/golden_qwen2.safetensors: a tiny Qwen2 (Llama blocks with q/k/v
biases, GQA 4 query / 2 kv heads, tied embeddings as the small Qwen2.5 sizes) in HF transformers,
fp32, CPU, fixed seed, with inputs, logits, loss, every gradient and a 10-step AdamW trajectory.
Run from the repository root: python3 dev/golden_qwen2.py (see dev/golden_common.py)."""

import json
import os
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import write  # noqa: E402

CONFIG = {
    "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False,
}

if __name__ == "__main__":
    torch.manual_seed(44)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="eager")).float().train()
    # HF initialises biases to zero; random ones test that they are loaded and used.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.02)
    write(model, json.dumps(CONFIG), "crates/engine/tests/data/golden_qwen2.safetensors", seed=44)
