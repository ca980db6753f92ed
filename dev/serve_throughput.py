"""Throughput of a running `frugal serve`: 16 greedy requests of 64 tokens one at a time, then
all 16 at once (continuous batching), with the standard library only.

    frugal serve --model SmolLM2-135M-Instruct.Q4_1.gguf --port 8790 --ctx 512 --max-seqs 16 &
    python dev/serve_throughput.py --port 8790
"""

import argparse
import json
import threading
import time
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, default=8000)
p.add_argument("--requests", type=int, default=16)
p.add_argument("--max-tokens", type=int, default=64)
a = p.parse_args()
URL = f"http://127.0.0.1:{a.port}/v1/completions"


def one(i):
    body = json.dumps({"prompt": f"Story {i}: Once upon a time", "max_tokens": a.max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(URL, body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["usage"]["completion_tokens"]


for concurrent in (1, a.requests):
    tokens = [0] * a.requests
    start = time.time()
    if concurrent == 1:
        for i in range(a.requests):
            tokens[i] = one(i)
    else:
        def work(i):
            tokens[i] = one(i)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(a.requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    dt = time.time() - start
    print(f"{concurrent:3d} at a time: {sum(tokens)} tokens in {dt:.2f} s = {sum(tokens) / dt:.1f} tokens/s")
