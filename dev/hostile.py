"""Hostile-user cases against the release binary, counted by outcome.

Each case runs `frugal` the way a careless or hostile user would (absurd sizes, wrong files,
changed models on resume, signals in long phases, clients that misbehave) and is judged:
- handled: refused with an error that names the problem (or, where the input is legal, it runs
  and its numbers are right);
- panic: exit status 101, "panicked at", or death by a signal the case did not send;
- hang: still running at the case's deadline;
- lost: a trained model or snapshot that should exist does not, or one was replaced;
- wrong: accepted silently where it must be refused, or a wrong result;
- unclear: refused, but the error does not name what the case expects;
- skipped: the case cannot run here (no root for a small tmpfs, no SmolLM2 file).

Run from the repository root after `cargo build --release`:
    python3 dev/hostile.py [--frugal target/release/frugal] [--only SUBSTRING]
Prints one line per case, then the counts; exits 1 unless every case is handled or skipped.
"""


import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import hostile_lib as lib
from hostile_lib import (CASES, TINY, Run, Server, case, edited, free_port, raw,
                         refuses, resume_with, train)

@case("panic/hang")
def page_huge_content_length(w):
    srv = Server(["web"], free_port())
    try:
        _, answer = raw(srv.port, b"POST /api/plan HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 99999999999\r\n\r\nx")
        after = srv.alive_answer()
        if srv.p.poll() is not None:
            return "panic", "the page server died"
        ok = "413" in answer.split("\r\n")[0] and after and "200" in after
        return ("handled" if ok else "wrong"), f"{answer.splitlines()[0] if answer else '-'}; then {after}"
    finally:
        srv.stop()


@case("panic/hang")
def page_pipelined_flood_does_not_block_others(w):
    srv = Server(["web"], free_port())
    try:
        flood = socket.create_connection(("127.0.0.1", srv.port))
        flood.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 5000)
        t = time.time()
        after = srv.alive_answer(timeout=10)
        took = time.time() - t
        flood.close()
        if after is None:
            return "hang", "another client got no answer in 10 s"
        return ("handled" if took < 5 else "hang"), f"another client answered in {took:.2f} s"
    finally:
        srv.stop()


@case("panic/hang")
def openai_server_survives_bad_clients(w):
    model = train(w, "serve-model", "llama-tiny", steps=2)
    srv = Server(["serve", "--model", model], free_port())
    try:
        answers = []
        body = b'{"model": "x", "prompt": '
        for data in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999"
                     b"\r\n\r\n{",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 22\r\n\r\n"
                     b'{"max_tokens": 1e999}x'):
            s, answer = raw(srv.port, data, timeout=10)
            s.close()
            answers.append(answer.split("\r\n")[0] if answer else "(none)")
        # A body shorter than its Content-Length, and a client that never sends the rest.
        s, _ = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40"
                   b"\r\n\r\n" + body, read=False)
        # A streaming client that goes away mid-answer.
        req = json.dumps({"model": os.path.basename(model), "prompt": "hello", "max_tokens": 200,
                          "stream": True}).encode()
        s, _ = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   b"application/json\r\nContent-Length: " + str(len(req)).encode() + b"\r\n\r\n"
                   + req, timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        after = srv.alive_answer("/health", timeout=10)
        s.close()
        if srv.p.poll() is not None:
            return "panic", "the server died: " + srv.p.stderr.read().decode()[-200:]
        bad = [a for a in answers if not (" 4" in a)]
        if bad or not after or "200" not in after:
            return "wrong", f"answers {answers}; then /health {after}"
        return "handled", f"{answers}; /health after a dropped stream: {after}"
    finally:
        srv.stop()


@case("panic/hang")
def sample_tokens_unbounded(w):
    return refuses(["train", "--model", "gpt2-tiny", "--steps", "1", "--batch", "2", "--seq",
                    "32", "--sample-tokens", "99999999"], "--sample-tokens")


@case("panic/hang")
def data_from_dev_zero(w):
    verdict, detail = refuses(["train", "--model", "gpt2-tiny", "--steps", "1", "--data",
                               "/dev/zero"] + TINY, "--data", timeout=30)
    return verdict, detail


@case("lost")
def sigterm_in_the_sample_keeps_the_model(w):
    out = os.path.join(w, "sample-sigterm")
    p = subprocess.Popen([lib.FRUGAL, "train", "--model", "gpt2-tiny", "--steps", "1", "--batch",
                          "2", "--seq", "32", "--sample-tokens", "200", "--top-k", "0",
                          "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists(os.path.join(out, "model.safetensors")):
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        return "hang", "SIGTERM during the sample was not answered in 30 s"
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        return "lost", "no model.safetensors"
    return "handled", f"exit {p.returncode}, the model is saved"


# ---- lost work ----------------------------------------------------------------------------

@case("lost")
def export_over_its_own_source(w):
    out = train(w, "x5", "gpt2-tiny", steps=3)
    before = open(os.path.join(out, "model.safetensors"), "rb").read()
    v = refuses(["export", out, "--hf", out], "--hf")
    if open(os.path.join(out, "model.safetensors"), "rb").read() != before:
        return "lost", "the model was replaced"
    return v


@case("lost")
def export_over_another_model(w):
    a, b = train(w, "exp-a", "gpt2-tiny"), train(w, "exp-b", "gpt2-tiny", "--seed", "2")
    return refuses(["export", a, "--hf", b], "--overwrite")


@case("lost")
def second_train_into_a_finished_out(w):
    out = os.path.join(w, "ow")
    r = Run(["train", "--model", "gpt2-tiny", "--steps", "1", "--out", out] + TINY)
    assert r.rc == 0, r.err
    return refuses(["train", "--model", "llama-tiny", "--steps", "1", "--out", out] + TINY,
                   "--overwrite")


@case("lost")
def out_on_a_full_disk(w):
    mnt = os.path.join(w, "small")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        return "skipped", "cannot mount a small tmpfs here (needs root)"
    try:
        return refuses(["train", "--model", "gpt2-mini", "--steps", "40", "--out",
                        os.path.join(mnt, "run")] + TINY, "space")
    finally:
        subprocess.run(["umount", mnt])


# ---- silently wrong -----------------------------------------------------------------------

@case("wrong")
def resume_changed_top_k(w):
    return resume_with(w, "mixtral-tiny", "topk", num_experts_per_tok=1)


@case("wrong")
def resume_changed_router_aux_loss(w):
    return resume_with(w, "mixtral-tiny", "aux", router_aux_loss_coef=0.5)


@case("wrong")
def resume_changed_routed_scaling(w):
    return resume_with(w, "deepseek-tiny", "scaling", routed_scaling_factor=2.5)


@case("wrong")
def resume_changed_topk_method(w):
    return resume_with(w, "deepseek-tiny", "method", topk_method="group_limited_greedy",
                       n_group=2, topk_group=1)


@case("wrong")
def resume_window_8_to_16(w):
    out = train(w, "win8", edited(w, train(w, "win-src", "mixtral-tiny"), "w8", sliding_window=8))
    return refuses(["train", "--model", edited(w, out, "w16", sliding_window=16), "--resume", out,
                    "--out", out, "--steps", "2"] + TINY, "window")


@case("wrong")
def resume_window_8_to_none(w):
    out = train(w, "win8b", edited(w, train(w, "win-src2", "mixtral-tiny"), "w8b",
                                   sliding_window=8))
    return refuses(["train", "--model", edited(w, out, "wnone", sliding_window=None), "--resume",
                    out, "--out", out, "--steps", "2"] + TINY, "window")


@case("wrong")
def resume_window_none_to_8(w):
    out = train(w, "winnone", "mixtral-tiny")
    return refuses(["train", "--model", edited(w, out, "w8c", sliding_window=8), "--resume", out,
                    "--out", out, "--steps", "2"] + TINY, "window")


@case("wrong")
def lora_resume_and_merge_on_another_base(w):
    a, b = train(w, "base-a", "gpt2-tiny"), train(w, "base-b", "gpt2-tiny", "--seed", "9")
    ad = train(w, "adapter", a, "--lora-rank", "4")
    v1 = refuses(["train", "--model", b, "--lora-rank", "4", "--resume", ad, "--out", ad,
                  "--steps", "2"] + TINY, "base")
    v2 = refuses(["export", os.path.join(ad, "step-000002"), "--merge", "--base", b, "--hf",
                  os.path.join(w, "merged-wrong")], "--base")
    return (v1 if v1[0] != "handled" else v2)


def generate_json(args):
    r = Run(["generate", "--json"] + args)
    if r.panicked() or r.hung:
        return None, r
    try:
        return json.loads(r.out), r
    except ValueError:
        return None, r


@case("wrong")
def speculative_plan_equals_measured(w):
    m = train(w, "gen", "llama-tiny")
    for extra in (["--draft", m], ["--draft", m, "--max-new-tokens", "0"], ["--max-new-tokens",
                                                                             "0"]):
        v, r = generate_json(["--model", m, "--prompt", "hello"] + extra)
        if r.panicked():
            return "panic", r.err[-200:]
        if r.rc != 0 or v is None:
            return "wrong", f"{extra}: exit {r.rc} {r.err.strip()[-160:]}"
        if v.get("planned") is None or v.get("planned") != v.get("measured"):
            return "wrong", f"{extra}: planned {v.get('planned')} vs measured {v.get('measured')}"
    return "handled", "planned == measured with a draft, with 0 new tokens, and both"


@case("wrong")
def draft_tokens_zero(w):
    m = train(w, "gen0", "llama-tiny")
    return refuses(["generate", "--model", m, "--draft", m, "--draft-tokens", "0", "--prompt",
                    "hi"], "--draft-tokens")


def nan_model(w, tag):
    src = train(w, "nan-src-" + tag, "llama-tiny")
    dst = os.path.join(w, "nan-model-" + tag)
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    from safetensors.numpy import load_file, save_file
    t = load_file(os.path.join(src, "model.safetensors"))
    name = sorted(t)[0]
    t[name] = t[name].copy()
    t[name].flat[3] = float("nan")
    save_file(t, os.path.join(dst, "model.safetensors"))
    return dst, name


@case("wrong")
def nan_weights_generate(w):
    m, name = nan_model(w, "generate")
    return refuses(["generate", "--model", m, "--prompt", "hi"], name)


@case("wrong")
def nan_weights_train(w):
    m, name = nan_model(w, "train")
    return refuses(["train", "--model", m, "--steps", "1"] + TINY, name)


@case("wrong")
def weights_file_is_a_folder(w):
    d = os.path.join(w, "dir-weights")
    src = train(w, "dw-src", "gpt2-tiny")
    os.makedirs(os.path.join(d, "model.safetensors"))
    shutil.copy(os.path.join(src, "config.json"), d)
    return refuses(["train", "--model", d, "--steps", "1"] + TINY, "model.safetensors")


@case("wrong")
def lora_rank_past_the_matrix(w):
    return refuses(["train", "--model", "gpt2-tiny", "--lora-rank", "100000", "--steps", "1"]
                   + TINY, "--lora-rank")


@case("wrong")
def kv_block_zero_and_huge(w):
    m = train(w, "kvb", "llama-tiny")
    v = refuses(["generate", "--model", m, "--kv-block", "0", "--prompt", "hi"], "--kv-block")
    if v[0] != "handled":
        return v
    return refuses(["generate", "--model", m, "--kv-block", "1000000000", "--prompt", "hi"],
                   "--kv-block")


@case("wrong")
def plan_seq_past_positions(w):
    return refuses(["plan", "--model", "gpt2-124m", "--train", "--seq", str(2 ** 40)], "--seq")


@case("wrong")
def plan_weight_group_7(w):
    return refuses(["plan", "--model", "llama2-7b", "--infer", "--weights", "int4",
                    "--weight-group", "7"], "--weight-group")


@case("wrong")
def lora_dropout_nan(w):
    return refuses(["train", "--model", "gpt2-tiny", "--lora-rank", "4", "--lora-dropout", "NaN",
                    "--steps", "1"] + TINY, "--lora-dropout")


@case("wrong")
def manifest_step_disagrees_with_folder(w):
    out = train(w, "mani", "gpt2-tiny")
    snap = os.path.join(out, "step-000002")
    moved = os.path.join(out, "step-000007")
    os.rename(snap, moved)
    return refuses(["export", moved, "--hf", os.path.join(w, "mani-hf")], "step")


@case("wrong")
def save_quantized_into_its_own_folder(w):
    m = train(w, "sq", "llama-tiny")
    return refuses(["generate", "--model", m, "--weights", "int8", "--save-quantized", m,
                    "--prompt", "hi"], "--save-quantized")


# ---- misleading errors --------------------------------------------------------------------

@case("unclear")
def a_tiny_corpus_says_how_many_tokens(w):
    p = os.path.join(w, "hello.txt")
    open(p, "w").write("hello")
    v = refuses(["train", "--model", "gpt2-tiny", "--steps", "1", "--data", p] + TINY, "token")
    if v[0] == "handled" and "(0 tokens)" in v[1]:
        return "unclear", v[1]
    return v


@case("unclear")
def a_folder_without_weights_is_named_so(w):
    d = os.path.join(w, "empty-out")
    os.makedirs(d)
    return refuses(["export", d, "--hf", os.path.join(w, "e2")], "snapshot")


@case("unclear")
def precision_lists_what_train_takes(w):
    r = Run(["train", "--model", "gpt2-tiny", "--precision", "fp64", "--steps", "1"] + TINY)
    if r.rc == 0 or r.panicked():
        return ("panic" if r.panicked() else "wrong"), r.err[-200:]
    listed = [p for p in ("fp32", "bf16", "fp16") if p in r.err]
    return ("handled" if len(listed) == 3 else "unclear"), r.err.strip().splitlines()[-1][:160]


@case("unclear")
def no_error_suggests_a_missing_command(w):
    bad = []
    for args in (["generate", "--model", "llama-tiny", "--prompt", "x"],
                 ["bench", "quality", "--model", "llama-tiny"],
                 ["bench", "generate", "--model", "nosuch"]):
        r = Run(args)
        if "frugal quantize" in r.err:
            bad.append(" ".join(args))
    return ("unclear" if bad else "handled"), (f"names frugal quantize: {bad}" if bad else
                                               "no error names a missing command")



import hostile_more  # noqa: E402,F401  (registers its cases after these)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default=lib.FRUGAL)
    p.add_argument("--only", default="")
    a = p.parse_args()
    lib.FRUGAL = os.path.abspath(a.frugal)
    counts = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as w:
        for category, name, fn in CASES:
            if a.only not in name:
                continue
            t = time.time()
            try:
                verdict, detail = fn(w)
            except Exception as e:  # a case that could not be set up is a failure to look at
                verdict, detail = "error", f"{type(e).__name__}: {e}"
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:8} {category:10} {name} ({time.time() - t:.1f} s): {detail}",
                  flush=True)
    total = sum(counts.values())
    print(f"\n{total} cases in {time.time() - t0:.0f} s: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    sys.exit(0 if counts.get("handled", 0) + counts.get("skipped", 0) == total else 1)


if __name__ == "__main__":
    main()
