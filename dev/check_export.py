"""Checks that `frugal export` turns a training snapshot into a folder HF transformers loads, with
the same logits frugal computes.

For GPT-2, Llama, Mixtral and DeepSeek-V2 blocks (gpt2-tiny, llama-tiny, mixtral-tiny, deepseek-tiny):
trains a few steps on 2 ranks with
`--save-every`, so the snapshot holds two optimizer/weight shards; `frugal export SNAPSHOT --hf OUT
--logits REF` rebuilds the model from those shards, writes config.json + model.safetensors and
frugal's own logits on a prompt; this script loads OUT with AutoModelForCausalLM.from_pretrained,
runs the same tokens and compares. fp32 on both sides: the tolerance is 1e-4 absolute (summation
order only). It also checks that the exported weights equal the snapshot's model.safetensors.

Run from the repository root after `cargo build`:
    python3 dev/check_export.py [--frugal target/debug/frugal] [--steps 4]
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
    run = os.path.join(workdir, model + "-run")
    out = os.path.join(workdir, model + "-hf")
    ref = os.path.join(workdir, model + "-logits.safetensors")
    text = os.path.join(workdir, "text.txt")
    train = [frugal, "train", "--model", model, "--steps", str(steps), "--batch", "1",
             "--ranks", "2", "--seq", "64", "--val-every", str(steps), "--sample-tokens", "0",
             "--data", text, "--save-every", str(steps), "--out", run, "--json"]
    subprocess.run(train, check=True, stdout=subprocess.DEVNULL)
    snapshot = os.path.join(run, f"step-{steps:06d}")
    subprocess.run([frugal, "export", snapshot, "--hf", out, "--logits", ref], check=True,
                   stdout=subprocess.DEVNULL)
    same_weights = all(
        torch.equal(a, b) for a, b in zip(
            load_file(os.path.join(out, "model.safetensors")).values(),
            load_file(os.path.join(snapshot, "model.safetensors")).values()))
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    saved = load_file(ref)
    with torch.no_grad():
        logits = hf(input_ids=saved["tokens"].long()).logits
    err = (logits - saved["logits"]).abs().max().item()
    ok = err <= TOLERANCE and same_weights
    print(f"{model}: snapshot of step {steps} on 2 ranks exported; HF logits vs frugal max |diff| "
          f"= {err:.3e} over {tuple(logits.shape)} (tolerance {TOLERANCE:g}); exported weights "
          f"{'equal' if same_weights else 'DIFFER FROM'} the snapshot's: {'OK' if ok else 'FAIL'}")
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default="target/debug/frugal")
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        path = "data/shakespeare/hamlet.txt"
        if not os.path.exists(path):
            sys.exit(f"cannot find {path}: run from the repository root")
        corpus = open(path, encoding="utf-8").read()
        with open(os.path.join(workdir, "text.txt"), "w", encoding="utf-8") as f:
            f.write(corpus[:60000])
        models = ("gpt2-tiny", "llama-tiny", "mixtral-tiny", "deepseek-tiny")
        results = [check(a.frugal, m, a.steps, workdir) for m in models]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
