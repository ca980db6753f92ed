"""Writes crates/engine/tests/data/golden_gpt2.safetensors: a tiny GPT-2 in HF transformers
(fp32, CPU, fixed seed) with inputs, logits, loss, every gradient and a 10-step AdamW trajectory.
Run from the repository root: python3 dev/golden_gpt2.py (see dev/golden_common.py)."""

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import write  # noqa: E402

CONFIG = {
    "model_type": "gpt2", "vocab_size": 96, "n_positions": 32, "n_embd": 32, "n_layer": 2,
    "n_head": 4, "n_inner": 128, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
    "bos_token_id": None, "eos_token_id": None,
}

if __name__ == "__main__":
    torch.manual_seed(42)
    model = GPT2LMHeadModel(GPT2Config(**CONFIG, attn_implementation="eager")).float().train()
    write(model, json.dumps(CONFIG), "crates/engine/tests/data/golden_gpt2.safetensors", seed=42)
