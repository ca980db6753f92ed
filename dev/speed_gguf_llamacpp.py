"""llama.cpp's prefill and decode speed on a GGUF file (llama-cpp-python built from source,
GGML_NATIVE, the given threads), for comparison with `frugal generate --json` on the same file.

    venv/bin/python dev/speed_gguf_llamacpp.py model.gguf "ROMEO:" 64 2

Prints one JSON line: {"prefill_tokens_per_s": ..., "decode_tokens_per_s": ..., "prompt_tokens": ...}.
"""
import json
import sys
import time

import llama_cpp


def main(path, prompt, new, threads):
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(new):
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
        llm.eval([tok])
    decode = time.perf_counter() - t1
    print(json.dumps({"prompt_tokens": len(ids), "prefill_tokens_per_s": len(ids) / prefill,
                      "decode_tokens_per_s": new / decode}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
