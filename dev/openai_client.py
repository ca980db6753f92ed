"""Drive `frugal serve` with the `openai` Python package, streaming and not, and check the greedy
answer against `frugal generate`'s tokens.

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
print(json.dumps({
    "completion": text, "usage": whole.usage.model_dump(),
    "streamed_equals_whole": streamed == text,
    "whole_equals_generate": text == generated,
    "chat": chat.choices[0].message.content, "chat_finish": chat.choices[0].finish_reason,
}, indent=2))
assert streamed == text and text == generated, "the server's greedy answer differs from frugal generate's"
