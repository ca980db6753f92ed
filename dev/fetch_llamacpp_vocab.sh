#!/usr/bin/env bash
# llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with their .inp texts and the
# .out ids llama.cpp gives them) from llama-cpp-python's source package on PyPI, into DIR.
#
#   dev/fetch_llamacpp_vocab.sh DIR [PYTHON]
set -euo pipefail
dir="$1"
python="${2:-python3}"
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==0.3.36" -d "$tmp"
"$python" - "$tmp"/llama_cpp_python-0.3.36.tar.gz "$dir" <<'PY'
import os, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
with tarfile.open(src) as t:
    for m in t.getmembers():
        name = os.path.basename(m.name)
        if m.isfile() and "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
            with t.extractfile(m) as f, open(os.path.join(dst, name), "wb") as out:
                out.write(f.read())
PY
