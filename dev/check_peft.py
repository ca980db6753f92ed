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

Run from the repository root after `cargo build --release`:
    python3 dev/check_peft.py [--frugal target/release/frugal]
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


def check(frugal, preset, workdir):
    base_dir = os.path.join(workdir, preset + "-base")
    frugal_train(frugal, ["--model", preset, "--steps", "40", "--batch", "2", "--seq", "64",
                          "--data", "data/shakespeare/hamlet.txt", "--out", base_dir])
    ok = True
    for base, extra in (("fp32", []), ("nf4", ["--double-quant"])):
        ad = os.path.join(workdir, f"{preset}-{base}-lora")
        dump = ad + "-logits.safetensors"
        frugal_train(frugal, ["--model", base_dir, "--steps", "20", "--batch", "2", "--seq", "64",
                              "--data", "data/shakespeare/tempest.txt", "--lora-rank", "8",
                              "--lora-alpha", "16", "--lora-base", base, "--out", ad, "--merge",
                              "--save-val-logits", dump, "--val-every", "20"] + extra)
        saved = load_file(dump)
        tokens = saved["tokens"].long()
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(ad, "merged"),
                                                      dtype=torch.float32).eval()
        merged_logits = logits_of(merged, tokens)
        if base == "fp32":
            hf = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
            peft = PeftModel.from_pretrained(hf, ad).eval()
            peft_logits = logits_of(peft, tokens)
            err = (peft_logits - saved["logits"]).abs().max().item()
            merge_err = (merged_logits - peft_logits).abs().max().item()
            good = err <= LOGITS_TOL and merge_err <= MERGE_TOL
            print(f"{preset} fp32 base: PEFT over HF vs frugal max |diff| = {err:.3e}, merged vs "
                  f"PEFT = {merge_err:.3e} ({'OK' if good else 'FAIL'})")
        else:
            err = (merged_logits - saved["logits"]).abs().max().item()
            good = err <= LOGITS_TOL
            print(f"{preset} nf4+dq base: merged into dequant(quant(W)) in HF vs frugal's "
                  f"adapters max |diff| = {err:.3e} ({'OK' if good else 'FAIL'})")
        ok = ok and good
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default="target/release/frugal")
    a = p.parse_args()
    if not os.path.exists("data/shakespeare/tempest.txt"):
        sys.exit("run from the repository root")
    with tempfile.TemporaryDirectory() as workdir:
        results = [check(a.frugal, m, workdir) for m in ("gpt2-tiny", "llama-tiny")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
