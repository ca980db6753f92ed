"""List the tensors PyTorch autograd saves for backward in an HF causal-LM training forward.

Runs on CPU with small shapes; dedupes saved tensors by storage (views share one) and skips the
parameters' own storage, then prints bytes per token per layer, by dtype, and each distinct saved
storage of one layer. Used to derive the `pytorch` runtime profile of crates/plan (src/pytorch).
CPU autocast differs from CUDA autocast (op lists), so AMP is derived from the CUDA lists instead;
fp32 and pure-bf16 (no autocast) carry over to CUDA, except the SDPA kernel choice.

    python dev/pytorch_saved_tensors.py gpt2 fp32
    python dev/pytorch_saved_tensors.py llama bf16 --eager
"""
import argparse
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig


def config(family, n_layer, eager):
    if family == "gpt2":
        # CPU dropout keeps an fp32 noise tensor and forces SDPA's math path; CUDA keeps a bool
        # mask and runs flash/mem-efficient with in-kernel dropout, so dropout is off here.
        c = GPT2Config(n_embd=64, n_layer=n_layer, n_head=4, vocab_size=1000, n_positions=256,
                       attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    else:
        c = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=n_layer,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                        max_position_embeddings=256, tie_word_embeddings=False)
    c._attn_implementation = "eager" if eager else "sdpa"
    return c


def saved(family, n_layer, dtype, b, t, eager, ckpt, verbose=False):
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config(family, n_layer, eager), dtype=dtype).train()
    if ckpt:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    seen = {}

    def pack(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            s = x.untyped_storage()
            if s.data_ptr() not in params and s.data_ptr() not in seen:
                seen[s.data_ptr()] = (s.nbytes(), x.dtype, tuple(x.shape))
        return x

    ids = torch.randint(0, 1000, (b, t))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = m(input_ids=ids, labels=ids).loss
    if verbose:
        for nbytes, dt, shape in seen.values():
            print(f"  {nbytes:>10} {str(dt):>15} {shape}")
    loss.backward()
    return sum(v[0] for v in seen.values()), seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=["gpt2", "llama"])
    ap.add_argument("dtype", choices=["fp32", "bf16"])
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--b", type=int, default=2)
    ap.add_argument("--t", type=int, default=128)
    a = ap.parse_args()
    dt = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    one, _ = saved(a.family, 1, dt, a.b, a.t, a.eager, a.ckpt)
    print("layer-2 storages:")
    two, _ = saved(a.family, 2, dt, a.b, a.t, a.eager, a.ckpt, verbose=True)
    tokens = a.b * a.t
    h = 64
    per_layer = two - one
    print(f"saved bytes: 1 layer {one}, 2 layers {two}")
    print(f"per layer per token: {per_layer / tokens:.1f} B = {per_layer / tokens / h:.3f} h")
    print(f"outside layers per token: {(one - per_layer) / tokens:.1f} B")


if __name__ == "__main__":
    main()
