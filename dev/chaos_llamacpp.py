"""How chaotic greedy text is when activations are rounded to 8 bits before every product, as
llama.cpp does for its Q4_0 ... Q8_0 files: a numpy transcription of llama.cpp's arithmetic for a
llama GGUF in Q4_1/Q8_0 (activations quantized as `quantize_row_q8_1` does, integer block dot
products, f64 everywhere else) against llama.cpp's own logits, and against itself with the
inputs of every rounding changed by 1e-7 (relative). Prints, at the last prompt position and the
next two, the rms and largest logit difference (after removing the mean shift) of each pair.

    venv/bin/python dev/chaos_llamacpp.py FILE "The capital of France is"
"""
import sys

import llama_cpp
import numpy as np
from gguf import GGUFReader

M, prompt = sys.argv[1], sys.argv[2]
r = GGUFReader(M); t = {x.name: x for x in r.tensors}
def field(key):
    f = r.fields[key]; v = f.parts[f.data[0]]; return v[0] if len(v) == 1 else v
def raw(name):
    x = t[name]; oc = int(x.shape[1]); ic = int(x.shape[0])
    b = np.frombuffer(x.data.tobytes(), dtype=np.uint8)
    if x.tensor_type.name == 'Q4_1':
        b = b.reshape(oc, ic // 32, 20)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        qs = b[..., 4:]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)  # (oc, nb, 32)
        return ('q4_1', d, m, q)
    if x.tensor_type.name == 'Q8_0':
        b = b.reshape(oc, ic // 32, 34)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
        q = b[..., 2:].copy().view(np.int8).astype(np.float64)
        return ('q8_0', d, None, q)
    raise Exception(x.tensor_type.name)
def f32(name):
    return np.array(t[name].data, dtype=np.float64)
def quant(x):  # x (n, ic) float32 -> codes (n, nb, 32), d16 (n, nb), s16 (n, nb)
    x = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(x).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide='ignore'):
        idv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((x * idv[..., None]).astype(np.float32))
    s = (d * q.sum(-1).astype(np.float32)).astype(np.float32)
    return q.astype(np.float64), d.astype(np.float16).astype(np.float64), s.astype(np.float16).astype(np.float64)
def mm(x, W, exact):
    kind, d, m, q = W
    if not exact:
        w = d[..., None] * q + (m[..., None] if m is not None else 0)
        return x @ w.reshape(w.shape[0], -1).T
    qa, da, sa = quant(x)
    isum = np.einsum('nbk,obk->nob', qa, q)
    out = np.einsum('nob,ob,nb->no', isum, d, da)
    if m is not None:
        out += np.einsum('ob,nb->no', m, sa)
    return out
nl = int(field('llama.block_count')); nh = int(field('llama.attention.head_count')); nkv = int(field('llama.attention.head_count_kv'))
eps = float(field('llama.attention.layer_norm_rms_epsilon')); base = float(field('llama.rope.freq_base'))
E = raw('token_embd.weight')
emb = (E[1][..., None] * E[3]).reshape(E[1].shape[0], -1)
L = [{k: (f32 if k.endswith('norm') else raw)(f'blk.{i}.{k}.weight') for k in ['attn_norm','attn_q','attn_k','attn_v','attn_output','ffn_norm','ffn_gate','ffn_up','ffn_down']} for i in range(nl)]
norm = f32('output_norm.weight'); D = emb.shape[1]; hd = D // nh
def rms(x, g): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * g
def rope(x, pos):
    i = np.arange(hd//2); th = pos[:, None] * base ** (-2.0*i/hd)
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]; o = np.empty_like(x)
    o[..., 0::2] = x0*c - x1*s; o[..., 1::2] = x0*s + x1*c; return o
def fwd(ids, exact):
    n = len(ids); x = emb[ids]; pos = np.arange(n, dtype=np.float64); mask = np.triu(np.full((n,n), -np.inf), 1)
    for l in L:
        h = rms(x, l['attn_norm'])
        q = rope(mm(h, l['attn_q'], exact).reshape(n, nh, hd), pos)
        k = rope(mm(h, l['attn_k'], exact).reshape(n, nkv, hd), pos)
        v = mm(h, l['attn_v'], exact).reshape(n, nkv, hd)
        rep = nh // nkv; k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        s = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        a = np.einsum('hqk,khd->qhd', p, v).reshape(n, D)
        x = x + mm(a, l['attn_output'], exact)
        h = rms(x, l['ffn_norm'])
        g = mm(h, l['ffn_gate'], exact)
        x = x + mm((g/(1+np.exp(-g))) * mm(h, l['ffn_up'], exact), l['ffn_down'], exact)
    return mm(rms(x, norm), E, exact)
llm = llama_cpp.Llama(model_path=M, n_ctx=512, n_threads=2, verbose=False, logits_all=True, type_k=0, type_v=0)
ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
llm.reset(); llm.eval(ids)
for _ in range(2):
    llm.eval([int(np.array(llm.scores[llm.n_tokens - 1]).argmax())])
ids = list(llm.input_ids[:llm.n_tokens])
P = len(ids) - 2
ex = fwd(ids, True); fl = fwd(ids, False)
def cmp(a, b):
    d = a - b; d = d - d.mean(); return 'rms %.4f max %.4f' % (np.sqrt((d*d).mean()), np.abs(d).max())
for i in range(3):
    th = np.array(llm.scores[P-1+i])
    print(i, 'transcription vs llama.cpp', cmp(ex[P-1+i], th), '| f64 without rounding vs llama.cpp', cmp(fl[P-1+i], th))
# The same with every rounding's input changed by 1e-7 (relative).
rng = np.random.default_rng(0)
old_rms = rms
def rms(x, g): return old_rms(x * (1 + 1e-7 * rng.standard_normal(x.shape)), g)
ex2 = fwd(ids, True)
for i in range(3):
    print(i, 'transcription vs itself perturbed', cmp(ex[P-1+i], ex2[P-1+i]))
fl2 = fwd(ids, False)
for i in range(3):
    print(i, 'f64 without rounding vs itself perturbed', cmp(fl[P-1+i], fl2[P-1+i]))
