"""Greedy continuations of frugal and llama.cpp side by side on one GGUF file: for each prompt,
how many of the first N tokens agree, and where the two part, llama.cpp's top two logits there.
With `--floor`, llama.cpp also against itself in its four attention set-ups (KV cache f32 or
f16, flash attention off or on): how far its own greedy text carries when only the order of
its f32 sums or its KV precision changes — the floor for any other implementation.

    venv/bin/python dev/greedy_llamacpp.py FILE target/release/frugal [--kv f32|f16] [--flash]
        [--tokens 48] [--frugal-args "--weights ggml"] [--floor] [--prompts FILE]

`--prompts FILE` takes the prompts from FILE, one a line (dev/greedy_prompts.txt holds 20),
instead of the five below; the last line counts the prompts whose whole continuation agrees.

llama.cpp is llama-cpp-python built from source (dev/golden_smollm2.py says how); frugal's
KV cache is f32, so `--kv f32` (the default here) puts llama.cpp's there too.
"""
import argparse
import json
import shlex
import subprocess

import llama_cpp
import numpy as np

PROMPTS = [
    "The capital of France is",
    "ROMEO:",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
]
KV_TYPES = {"f32": 0, "f16": 1}


def llama_greedy(llm, prompt, n):
    """llama.cpp's greedy tokens and the logits each was chosen from."""
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    out, logits = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        t = int(row.argmax())
        if t == llm.token_eos():
            break
        out.append(t)
        logits.append(row)
        llm.eval([t])
    return ids, out, logits


def frugal_greedy(binary, model, prompt, n, extra):
    cmd = [binary, "generate", "--model", model, "--prompt", prompt,
           "--max-new-tokens", str(n), "--json"] + shlex.split(extra)
    v = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return v["prompt_token_ids"], v["tokens"]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def floor(model, n):
    runs = {}
    for kv in KV_TYPES:
        for flash in (False, True):
            llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_threads=2, verbose=False,
                                  logits_all=True, type_k=KV_TYPES[kv], type_v=KV_TYPES[kv],
                                  flash_attn=flash)
            name = f"kv {kv}" + (", flash" if flash else "")
            runs[name] = [llama_greedy(llm, p, n)[1] for p in PROMPTS]
    names = list(runs)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            agree = [first_difference(a, b) for a, b in zip(runs[x], runs[y])]
            print(f"llama.cpp ({x}) against llama.cpp ({y}): {agree}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("frugal")
    p.add_argument("--kv", choices=KV_TYPES, default="f32")
    p.add_argument("--flash", action="store_true")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--frugal-args", default="")
    p.add_argument("--floor", action="store_true")
    p.add_argument("--prompts", help="a file of prompts, one a line")
    a = p.parse_args()
    prompts = PROMPTS
    if a.prompts:
        with open(a.prompts, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    if a.floor:
        floor(a.model, a.tokens)
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=512, n_threads=2, verbose=False,
                          logits_all=True, type_k=KV_TYPES[a.kv], type_v=KV_TYPES[a.kv],
                          flash_attn=a.flash)
    agree, whole = [], 0
    for prompt in prompts:
        ids, theirs, logits = llama_greedy(llm, prompt, a.tokens)
        our_ids, ours = frugal_greedy(a.frugal, a.model, prompt, a.tokens, a.frugal_args)
        assert our_ids == ids, f"{prompt!r}: prompt ids {our_ids} vs llama.cpp's {ids}"
        same = first_difference(ours, theirs)
        agree.append(same)
        whole += ours == theirs
        line = f"{prompt!r}: {same} of {len(theirs)} agree"
        if same < min(len(ours), len(theirs)):
            row = logits[same]
            top = np.argsort(row)[::-1][:2]
            line += (f"; at {same} llama.cpp {theirs[same]}, frugal {ours[same]};"
                     f" llama.cpp's top two {top[0]}={row[top[0]]:.4f} {top[1]}={row[top[1]]:.4f}")
        print(line)
    print("agree:", agree)
    print(f"{whole} of {len(prompts)} prompts: the whole continuation identical")


if __name__ == "__main__":
    main()
