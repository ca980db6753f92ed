"""Greedy generation from a Hugging Face folder: frugal's inference engine (`frugal generate`, KV
cache) against transformers' `generate(do_sample=False)` on the same tiny random GPT-2, Llama
(GQA), Qwen2 (q/k/v biases, tied embeddings), Mistral (a sliding window of 8 on every layer) and
Qwen2 with a window from layer 1 on, saved with `save_pretrained` (Qwen2 also in bf16 and sharded
over several files), Mixtral (4 experts, top 2) and DeepSeek-V2 (latent attention with its latent
cache, shared experts; with a query bottleneck and a dense first layer, and V2-Lite's direct
queries with group-limited routing), with KV blocks of 4 tokens. Prints one JSON
line per case with both token lists and
whether they are identical.

Example: python3 dev/check_generate.py --frugal target/release/frugal --tokens 24
"""

import argparse
import json
import subprocess
import tempfile

import torch
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default="target/release/frugal")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--prompt", default="ROMEO: But soft, what light")
    a = p.parse_args()
    torch.manual_seed(0)
    models = {
        "gpt2": GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                           vocab_size=50257, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)),
        "llama": LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128, vocab_size=50304,
                                              tie_word_embeddings=False)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128, vocab_size=50304,
                                              tie_word_embeddings=True, use_sliding_window=False)),
        # Sliding windows far shorter than the generation: Mistral on every layer (the engine
        # frees the blocks behind the window), Qwen2 from layer 1 on (layer 0 sees everything).
        "mistral": MistralForCausalLM(MistralConfig(hidden_size=64, intermediate_size=128,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, max_position_embeddings=128,
                                                    vocab_size=50304, sliding_window=8)),
        "qwen2-swa": Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=128,
                                                  vocab_size=50304, tie_word_embeddings=True,
                                                  use_sliding_window=True, sliding_window=8,
                                                  max_window_layers=1)),
        # A mixture of 4 experts, top 2.
        "mixtral": MixtralForCausalLM(MixtralConfig(hidden_size=64, intermediate_size=96,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, max_position_embeddings=128,
                                                    vocab_size=50304, num_local_experts=4,
                                                    num_experts_per_tok=2)),
        # DeepSeek-V2: latent attention with a query bottleneck, a dense first layer, then 4
        # routed experts (top 2, gates x 1.5) and 2 shared ones; V2-Lite's direct queries with
        # group-limited routing.
        "deepseek_v2": DeepseekV2ForCausalLM(DeepseekV2Config(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=2,
            num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=128,
            vocab_size=50304, routed_scaling_factor=1.5)),
        "deepseek_v2-lite": DeepseekV2ForCausalLM(DeepseekV2Config(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=32,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=128,
            vocab_size=50304, topk_method="group_limited_greedy", n_group=2, topk_group=1)),
    }
    with torch.no_grad():  # HF starts q/k/v biases at zero: random ones test they are used
        for layer in models["qwen2"].model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.02)
        # HF starts DeepSeek's routers at zero (every expert ties): random ones route.
        for name in ("deepseek_v2", "deepseek_v2-lite"):
            for layer in models[name].model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.weight.normal_(0.0, 0.5)
    for name, model in models.items():
        model.eval()
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d, safe_serialization=True)
            cache = ["--kv-block", "4"]
            out = subprocess.run([a.frugal, "generate", "--model", d, "--prompt", a.prompt,
                                  "--max-new-tokens", str(a.tokens), "--json"] + cache,
                                 capture_output=True, text=True, check=True)
            ours = json.loads(out.stdout)
            # frugal's GPT-2 tokenization of the prompt (HF's tokenizer files are not needed).
            prompt = ours["prompt_token_ids"]
            with torch.inference_mode():
                x = torch.tensor([prompt])
                y = model.generate(x, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                                   do_sample=False, pad_token_id=0, eos_token_id=None)
            theirs = y[0, len(prompt):].tolist()
            print(json.dumps({"family": name, "identical": ours["tokens"] == theirs,
                              "frugal": ours["tokens"], "hf": theirs}))
        if name != "qwen2":
            continue
        # The same model stored in bf16 and sharded (model.safetensors.index.json): frugal reads
        # the shards and widens bf16 exactly; HF generates from the same rounded weights in fp32.
        rounded = model.to(torch.bfloat16)
        with tempfile.TemporaryDirectory() as d:
            rounded.save_pretrained(d, safe_serialization=True, max_shard_size="200KB")
            out = subprocess.run([a.frugal, "generate", "--model", d, "--prompt", a.prompt,
                                  "--max-new-tokens", str(a.tokens), "--json"],
                                 capture_output=True, text=True, check=True)
            ours = json.loads(out.stdout)
            rounded = rounded.float()
            with torch.inference_mode():
                y = rounded.generate(torch.tensor([ours["prompt_token_ids"]]), max_new_tokens=a.tokens,
                                     min_new_tokens=a.tokens, do_sample=False, pad_token_id=0,
                                     eos_token_id=None)
            theirs = y[0, len(ours["prompt_token_ids"]):].tolist()
            print(json.dumps({"family": "qwen2 bf16, sharded", "identical": ours["tokens"] == theirs,
                              "frugal": ours["tokens"], "hf": theirs}))


if __name__ == "__main__":
    main()
