"""llama.cpp's perplexity of a GGUF model on a text, for comparison with `frugal perplexity`:
llama.cpp's own logits (llama-cpp-python, built from source) and llama-perplexity's arithmetic
(chunks of n_ctx tokens, BOS first when the model adds one, the second half of each chunk scored,
log-softmax with f32 exponentials summed in f64, the same standard error).

    venv/bin/python dev/perplexity_llamacpp.py model.gguf data/shakespeare/tempest.txt 512 8
"""
import sys

import llama_cpp
import numpy as np


def perplexity(path, text_path, n_ctx, chunks):
    """(PPL, its standard error, chunks, scored tokens) from llama.cpp's logits."""
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                          n_threads=2, verbose=False)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    text = open(text_path, encoding="utf-8").read()
    tokens = llm.tokenize(text.encode(), add_bos=add_bos, special=False)
    n = min(chunks, len(tokens) // n_ctx)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    for i in range(n):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:n_ctx], dtype=np.float32)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            s = np.exp(row - m, dtype=np.float32).astype(np.float64).sum()
            lp = float(row[tokens[i * n_ctx + j + 1]] - m) - np.log(s)
            nll -= lp
            nll2 += lp * lp
            count += 1
    mean = nll / count
    ppl = np.exp(mean)
    var = nll2 / count - mean * mean
    err = np.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    return float(ppl), float(err), n, count


def main(path, text_path, n_ctx, chunks):
    ppl, err, n, count = perplexity(path, text_path, n_ctx, chunks)
    print(f"llama.cpp {llama_cpp.__version__}: PPL = {ppl:.4f} +/- {err:.5f} over {n} chunks "
          f"of {n_ctx} ({count} scored)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
