"""Drive `frugal serve` with the `openai` Python package, streaming and not, and check the greedy
answer against `frugal generate`'s tokens, a seeded top_p draw against `generate --top-p --seed`'s,
and the log-probabilities in both endpoints' layouts as the package parses them.

    pip install openai
    frugal serve --model SmolLM2-135M-Instruct.Q4_1.gguf --port 8000 &
    python dev/openai_client.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--frugal target/release/frugal]
"""

import argparse
import json
import subprocess

from openai import OpenAI

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="the model file the server serves")
p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
p.add_argument("--frugal", default="target/release/frugal")
p.add_argument("--prompt", default="The three primary colors are")
p.add_argument("--max-tokens", type=int, default=24)
a = p.parse_args()

client = OpenAI(base_url=a.base_url, api_key="unused")
served = client.models.list().data[0].id
whole = client.completions.create(model=served, prompt=a.prompt, max_tokens=a.max_tokens, temperature=0)
text = whole.choices[0].text
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(
        model=served, prompt=a.prompt, max_tokens=a.max_tokens, temperature=0, stream=True
    )
)
out = subprocess.run(
    [a.frugal, "generate", "--model", a.model, "--prompt", a.prompt, "--max-new-tokens", str(a.max_tokens), "--json"],
    check=True, capture_output=True, text=True,
)
generated = json.loads(out.stdout)["text"]
chat = client.chat.completions.create(
    model=served, messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0, max_tokens=32,
)
# A seeded draw in the nucleus: the same draws as generate's.
drawn = client.completions.create(
    model=served, prompt=a.prompt, max_tokens=a.max_tokens, temperature=0.8, top_p=0.9, seed=7
).choices[0].text
out = subprocess.run(
    [a.frugal, "generate", "--model", a.model, "--prompt", a.prompt, "--max-new-tokens", str(a.max_tokens),
     "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--json"],
    check=True, capture_output=True, text=True,
)
drawn_generate = json.loads(out.stdout)["text"]
# Log-probabilities: each greedy token is its step's likeliest; the pieces are the text.
lp = client.completions.create(
    model=served, prompt=a.prompt, max_tokens=a.max_tokens, temperature=0, logprobs=2
).choices[0].logprobs
greedy_is_top = all(
    chosen == max(top.values()) for chosen, top in zip(lp.token_logprobs, lp.top_logprobs)
)
chat_lp = client.chat.completions.create(
    model=served, messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=8,
    logprobs=True, top_logprobs=2,
).choices[0]
chat_greedy_is_top = all(t.logprob == t.top_logprobs[0].logprob for t in chat_lp.logprobs.content)
print(json.dumps({
    "completion": text, "usage": whole.usage.model_dump(),
    "streamed_equals_whole": streamed == text,
    "whole_equals_generate": text == generated,
    "chat": chat.choices[0].message.content, "chat_finish": chat.choices[0].finish_reason,
    "top_p_draw_equals_generate": drawn == drawn_generate,
    "logprob_pieces_equal_text": "".join(lp.tokens) == text and greedy_is_top,
    "chat_logprobs": chat_greedy_is_top
    and "".join(t.token for t in chat_lp.logprobs.content) == chat_lp.message.content,
}, indent=2))
assert streamed == text and text == generated, "the server's greedy answer differs from frugal generate's"
assert drawn == drawn_generate, "the seeded top_p draw differs from frugal generate's"
assert "".join(lp.tokens) == text and greedy_is_top, "the completion's log-probabilities do not fit its text"
assert chat_greedy_is_top and "".join(t.token for t in chat_lp.logprobs.content) == chat_lp.message.content, \
    "the chat answer's log-probabilities do not fit its text"
