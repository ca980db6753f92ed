"""A SentencePiece Llama end to end against llama.cpp: writes a small `llama` GGUF (2 layers,
width 64, f32 random weights) with llama.cpp's Llama 2 test vocabulary (ggml-vocab-llama-spm.gguf,
32000 SentencePiece pieces, BOS first), then asks llama.cpp (llama-cpp-python) and `frugal
generate` for the prompt's ids and 24 greedy tokens of each prompt, and compares ids and text.

    venv/bin/python dev/check_spm_llamacpp.py VOCAB_DIR [target/release/frugal]

VOCAB_DIR holds ggml-vocab-llama-spm.gguf (dev/fetch_llamacpp_vocab.sh). Exits 1 on a difference.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
import llama_cpp

PROMPTS = ["Hello world", "The capital of France is", " two  spaces", "def f(x):\n    return",
           "Äpfel und Birnen"]


def write_model(vocab_path, out):
    v = gguf.GGUFReader(vocab_path)
    field = lambda k: v.fields[k]
    tokens = [bytes(field("tokenizer.ggml.tokens").parts[i]).decode("utf-8")
              for i in field("tokenizer.ggml.tokens").data]
    scores = [float(field("tokenizer.ggml.scores").parts[i][0])
              for i in field("tokenizer.ggml.scores").data]
    types = [int(field("tokenizer.ggml.token_type").parts[i][0])
             for i in field("tokenizer.ggml.token_type").data]
    n_vocab, d, ff, layers, heads, kv = len(tokens), 64, 128, 2, 4, 2
    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    rng = np.random.default_rng(0)
    t = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)
    ones = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    hd = d // heads
    w.add_tensor("token_embd.weight", t(n_vocab, d))
    w.add_tensor("output_norm.weight", ones(d))
    w.add_tensor("output.weight", t(n_vocab, d))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(d))
        w.add_tensor(b + "attn_q.weight", t(heads * hd, d))
        w.add_tensor(b + "attn_k.weight", t(kv * hd, d))
        w.add_tensor(b + "attn_v.weight", t(kv * hd, d))
        w.add_tensor(b + "attn_output.weight", t(d, heads * hd))
        w.add_tensor(b + "ffn_norm.weight", ones(d))
        w.add_tensor(b + "ffn_gate.weight", t(ff, d))
        w.add_tensor(b + "ffn_up.weight", t(ff, d))
        w.add_tensor(b + "ffn_down.weight", t(d, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(vocab_dir, frugal):
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "spm-llama.gguf")
        write_model(os.path.join(vocab_dir, "ggml-vocab-llama-spm.gguf"), model)
        llm = llama_cpp.Llama(model_path=model, n_ctx=256, n_threads=2, verbose=False,
                              logits_all=True, type_k=0, type_v=0)
        for p in PROMPTS:
            ids = llm.tokenize(p.encode(), add_bos=True, special=False)
            llm.reset()
            llm.eval(ids)
            theirs = []
            for _ in range(24):
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                if tok == llm.token_eos():
                    break
                theirs.append(tok)
                llm.eval([tok])
            text = llm.detokenize(theirs).decode("utf-8", errors="replace")
            out = subprocess.run([frugal, "generate", "--model", model, "--prompt", p,
                                  "--max-new-tokens", "24", "--json"],
                                 capture_output=True, text=True, check=True)
            v = json.loads(out.stdout)
            same_ids = v["prompt_token_ids"] == ids
            same = v["tokens"][:len(theirs)] == theirs
            same_text = v["text"] == text
            print(f"{p!r}: prompt ids {'equal' if same_ids else 'DIFFER'} ({len(ids)}), greedy "
                  f"{'equal' if same else 'DIFFER'} ({len(theirs)} tokens), text "
                  f"{'equal' if same_text else 'DIFFERS'}: {v['text']!r}")
            if not (same_ids and same and same_text):
                print(f"   llama.cpp: {ids} {theirs} {text!r}\n   frugal:    "
                      f"{v['prompt_token_ids']} {v['tokens']}")
                ok = False
    return ok


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else
                       "target/release/frugal") else 1)
