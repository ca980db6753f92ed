"""Writes crates/engine/tests/data/golden_mistral.safetensors: a tiny Mistral (Llama blocks with a
sliding window of 5 positions over sequences of 16, GQA 4 query / 2 kv heads) in HF transformers,
fp32, CPU, fixed seed, with inputs, logits, loss, every gradient and a 10-step AdamW trajectory.
Run from the repository root: python3 dev/golden_mistral.py (see dev/golden_common.py)."""

import json
import os
import sys

import torch
from transformers import MistralConfig, MistralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import write  # noqa: E402

CONFIG = {
    "model_type": "mistral", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 5,
}

if __name__ == "__main__":
    torch.manual_seed(45)
    model = MistralForCausalLM(MistralConfig(**CONFIG, attn_implementation="eager")).float().train()
    write(model, json.dumps(CONFIG), "crates/engine/tests/data/golden_mistral.safetensors", seed=45)
