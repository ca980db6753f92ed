"""Checks that a model trained by `frugal train` loads in HF transformers and gives the same logits.

Trains a tiny model with frugal (GPT-2 and Llama blocks), saves it with --out (model.safetensors
with HF names + config.json), loads the folder with AutoModelForCausalLM.from_pretrained, and
compares HF's logits on the first validation batch with the logits frugal wrote for the same
tokens. fp32 on both sides: the tolerance is 1e-4 absolute (summation order only).

Run from the repository root after `cargo build`:
    python3 dev/check_hf_logits.py [--frugal target/debug/frugal] [--steps 30]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-4


def check(frugal, model, steps, workdir):
    out = os.path.join(workdir, model)
    dump = os.path.join(workdir, model + "-logits.safetensors")
    text = os.path.join(workdir, "text.txt")
    cmd = [frugal, "train", "--model", model, "--steps", str(steps), "--batch", "2", "--seq", "64",
           "--val-every", str(steps), "--sample-tokens", "0", "--data", text, "--out", out,
           "--save-val-logits", dump, "--json"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    saved = load_file(dump)
    with torch.no_grad():
        logits = hf(input_ids=saved["tokens"].long()).logits
    err = (logits - saved["logits"]).abs().max().item()
    ok = err <= TOLERANCE
    print(f"{model}: trained {steps} steps, HF logits vs frugal max |diff| = {err:.3e} "
          f"({'OK' if ok else 'FAIL'}, tolerance {TOLERANCE:g})")
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default="target/debug/frugal")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        # A slice of the shipped corpus keeps tokenization instant.
        path = "data/shakespeare/hamlet.txt"
        if not os.path.exists(path):
            sys.exit(f"cannot find {path}: run from the repository root")
        corpus = open(path, encoding="utf-8").read()
        with open(os.path.join(workdir, "text.txt"), "w", encoding="utf-8") as f:
            f.write(corpus[:60000])
        results = [check(a.frugal, m, a.steps, workdir) for m in ("gpt2-tiny", "llama-tiny")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
