"""Checks that frugal's LoRA adapters load in PEFT over the HF base with the same logits, and that
the merged model (`frugal train --merge`) gives the adapter model's logits.

For GPT-2 and Llama blocks: trains a tiny base with frugal on one shipped play, fine-tunes LoRA
adapters on another (`--lora-rank 8`, all linear layers, fp32 base), then
- loads the base with AutoModelForCausalLM, the adapters with peft.PeftModel.from_pretrained,
  and compares their logits on the first validation batch with the logits frugal wrote
  (`--save-val-logits`): fp32 on both sides, tolerance 1e-4 (summation order only);
- loads OUT/merged and compares its logits with the PEFT model's (tolerance 1e-5);
- repeats the fine-tune over an nf4 base with double quantization (QLoRA) and compares frugal's
  adapter logits with its merged model's (merged into dequant(quant(W))) in transformers.

With --bnb it also loads QLoRA adapters over a base that bitsandbytes quantizes itself (its CPU
backend) and prints the largest logit difference, without a threshold: 5.7e-3 (nf4) and 4.9e-3
(nf4 + double quant) with bitsandbytes 0.50.2, against 2e-6 for the merged model; where
bitsandbytes' CPU 4-bit path departs from its own stored format was not found.

With --gguf FILE it repeats the fp32 and nf4 checks with adapters trained over a GGUF file
(`frugal train --model FILE`), PEFT loading them over the folder `frugal export FILE` writes, and
checks adapters trained over the file's own blocks (`--lora-base ggml`) as the fp32 ones.

Run from the repository root after `cargo build --release`:
    python3 dev/check_peft.py [--frugal target/release/frugal] [--bnb] [--gguf FILE]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

LOGITS_TOL = 1e-4
MERGE_TOL = 1e-5


def frugal_train(frugal, args):
    subprocess.run([frugal, "train", "--sample-tokens", "0", "--json"] + args, check=True,
                   stdout=subprocess.DEVNULL)


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits


def check(frugal, preset, workdir, gguf=None):
    """A base trained here from `preset`, or a GGUF file (`gguf`): the adapters train over the
    file itself, and PEFT loads them over the HF folder `frugal export` writes from it."""
    base_dir = os.path.join(workdir, preset + "-base")
    if gguf:
        subprocess.run([frugal, "export", gguf, "--hf", base_dir], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        frugal_train(frugal, ["--model", preset, "--steps", "40", "--batch", "2", "--seq", "64",
                              "--data", "data/shakespeare/hamlet.txt", "--out", base_dir])
    ok = True
    bases = [("fp32", []), ("nf4", ["--double-quant"])]
    if gguf:
        # The file's own blocks as the frozen base: the same values as fp32's, so PEFT over the
        # exported (dequantized) folder must match as closely.
        bases.append(("ggml", []))
    for base, extra in bases:
        ad = os.path.join(workdir, f"{preset}-{base}-lora")
        dump = ad + "-logits.safetensors"
        frugal_train(frugal, ["--model", gguf or base_dir, "--steps", "20", "--batch", "2",
                              "--seq", "64", "--data", "data/shakespeare/tempest.txt",
                              "--lora-rank", "8", "--lora-alpha", "16", "--lora-base", base,
                              "--out", ad, "--merge", "--save-val-logits", dump,
                              "--val-every", "20"] + extra)
        saved = load_file(dump)
        tokens = saved["tokens"].long()
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(ad, "merged"),
                                                      dtype=torch.float32).eval()
        merged_logits = logits_of(merged, tokens)
        if base in ("fp32", "ggml"):
            hf = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
            peft = PeftModel.from_pretrained(hf, ad).eval()
            peft_logits = logits_of(peft, tokens)
            err = (peft_logits - saved["logits"]).abs().max().item()
            merge_err = (merged_logits - peft_logits).abs().max().item()
            good = err <= LOGITS_TOL and merge_err <= MERGE_TOL
            print(f"{preset} {base} base: PEFT over HF vs frugal max |diff| = {err:.3e}, merged vs "
                  f"PEFT = {merge_err:.3e} ({'OK' if good else 'over the fp32 bound'})")
            if gguf and not good:
                # A real model's logits reach tens, and 30 layers of fp32 GEMMs round by about
                # 1e-4 in any order: PyTorch's merged and unmerged models differ by that much.
                # So measure both against PEFT in float64, and ask frugal's fp32 rounding to be
                # no larger than PyTorch's own.
                hf64 = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64).eval()
                exact = logits_of(PeftModel.from_pretrained(hf64, ad).eval(), tokens)
                ours = (saved["logits"].double() - exact).abs().max().item()
                torch32 = (peft_logits.double() - exact).abs().max().item()
                merged32 = (merged_logits.double() - exact).abs().max().item()
                good = ours <= 1.5 * torch32 and merged32 <= 1.5 * torch32
                print(f"{preset} {base} base, against PEFT in float64: frugal max |diff| = "
                      f"{ours:.3e}, PEFT in fp32 = {torch32:.3e}, frugal's merged model in HF = "
                      f"{merged32:.3e}; largest |logit| {exact.abs().max().item():.1f} "
                      f"({'OK' if good else 'FAIL'})")
        else:
            err = (merged_logits - saved["logits"]).abs().max().item()
            good = err <= LOGITS_TOL
            print(f"{preset} nf4+dq base: merged into dequant(quant(W)) in HF vs frugal's "
                  f"adapters max |diff| = {err:.3e} ({'OK' if good else 'FAIL'})")
        ok = ok and good
    return ok


LLAMA_128 = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 50257,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False,
}


def over_bitsandbytes(frugal, workdir):
    """Informational: frugal's QLoRA adapters loaded by PEFT over the base quantized by
    bitsandbytes itself (its CPU backend, nf4, fp32 compute; a Llama with 64-row k/v projections,
    which bitsandbytes' CPU packing needs). Prints the largest logit difference; no threshold."""
    import json
    from transformers import BitsAndBytesConfig
    config = os.path.join(workdir, "llama128.json")
    with open(config, "w") as f:
        json.dump(LLAMA_128, f)
    base_dir = os.path.join(workdir, "llama128-base")
    frugal_train(frugal, ["--model", config, "--steps", "40", "--batch", "2", "--seq", "64",
                          "--data", "data/shakespeare/hamlet.txt", "--out", base_dir])
    for dq in (False, True):
        ad = os.path.join(workdir, f"llama128-qlora-{dq}")
        dump = ad + "-logits.safetensors"
        frugal_train(frugal, ["--model", base_dir, "--steps", "20", "--batch", "2", "--seq", "64",
                              "--data", "data/shakespeare/tempest.txt", "--lora-rank", "8",
                              "--lora-alpha", "16", "--lora-base", "nf4", "--out", ad,
                              "--save-val-logits", dump, "--val-every", "20"]
                     + (["--double-quant"] if dq else []))
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.float32,
                               bnb_4bit_use_double_quant=dq)
        hf = AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=q,
                                                  dtype=torch.float32, device_map="cpu").eval()
        peft = PeftModel.from_pretrained(hf, ad).eval()
        saved = load_file(dump)
        err = (logits_of(peft, saved["tokens"].long()) - saved["logits"]).abs().max().item()
        print(f"llama128 nf4 (double quant {dq}): PEFT over a bitsandbytes base vs frugal "
              f"max |diff| = {err:.3e} (informational)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default="target/release/frugal")
    p.add_argument("--bnb", action="store_true",
                   help="also load the QLoRA adapters over a bitsandbytes-quantized base")
    p.add_argument("--gguf", help="also check adapters trained over this GGUF file (e.g. "
                   "SmolLM2-135M-Instruct.Q4_1.gguf), loaded by PEFT over its exported folder")
    a = p.parse_args()
    if not os.path.exists("data/shakespeare/tempest.txt"):
        sys.exit("run from the repository root")
    with tempfile.TemporaryDirectory() as workdir:
        results = [check(a.frugal, m, workdir) for m in ("gpt2-tiny", "llama-tiny")]
        if a.gguf:
            results.append(check(a.frugal, os.path.basename(a.gguf), workdir, gguf=a.gguf))
        if a.bnb:
            over_bitsandbytes(a.frugal, workdir)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
