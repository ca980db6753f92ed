#!/usr/bin/env bash
# The CUDA backend's check, for a machine with an NVIDIA GPU. Builds nothing: it takes a frugal
# binary built elsewhere with `cargo build --release -p frugal --features cuda` (run-time CPU
# dispatch, CUDA loaded at run time), and writes one report, $OUT/gpu_check.json and .md:
#   1. parity: `frugal train --device cuda` against `--device cpu` on the same config, 20 steps,
#      first/last loss and validation loss (fp32 within 1e-3 relative, bf16 within 2e-2);
#   2. memory: the arena's measured peak == its plan, and the bytes the driver gave (cuMemGetInfo)
#      == the slab and the backend's scratch in 2 MiB pages; the context reported apart;
#   3. speed: GPT-2 124M, bf16, B16 T1024, tokens/s against PyTorch eager and torch.compile
#      (dev/bench_pytorch_gpu.py, when python3 has torch and transformers).
# Finishes in well under 5 minutes on an H200. Exit 1 if a parity or memory check fails.
#
# Usage: dev/gpu_check.sh [path/to/frugal]   (OUT=dir to choose where the report goes)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/frugal}"
OUT="${OUT:-gpu_check}"
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "no frugal binary at $BIN (build it with --features cuda)" >&2; exit 2; }
# NVRTC and cuBLAS: the CUDA toolkit's, else pip's wheels (nvidia-cuda-nvrtc, nvidia-cublas).
for lib in $(python3 - <<'PY' 2>/dev/null
import glob, site, os
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for p in glob.glob(os.path.join(d, "nvidia", "*", "lib")) + glob.glob(os.path.join(d, "nvidia", "*", "*", "lib")):
        print(p)
PY
); do LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export FRUGAL_PTX_CACHE="$OUT/ptx"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true

run() { # name device extra-flags...
  local name=$1 device=$2; shift 2
  timeout 120 "$BIN" train --device "$device" --json --sample-tokens 0 --val-every 1000 "$@" \
    > "$OUT/$name.$device.json" 2> "$OUT/$name.$device.err"
  echo $? > "$OUT/$name.$device.rc"
}
PARITY=(
  "gpt2-fp32|--model gpt2-tiny --steps 20 --batch 4 --seq 64"
  "llama-fp32|--model llama-tiny --steps 20 --batch 4 --seq 64"
  "gpt2-bf16|--model gpt2-tiny --steps 20 --batch 4 --seq 64 --precision bf16"
  "llama-bf16-recompute|--model llama-tiny --steps 20 --batch 4 --seq 64 --precision bf16 --recompute full"
  "gpt2-mini-fp16|--model gpt2-mini --steps 20 --batch 4 --seq 128 --precision fp16"
)
for entry in "${PARITY[@]}"; do
  name="${entry%%|*}"; flags="${entry#*|}"
  # shellcheck disable=SC2086
  run "$name" cuda $flags
  # shellcheck disable=SC2086
  run "$name" cpu $flags
done
# shellcheck disable=SC2086
run speed cuda --model gpt2-124m --precision bf16 --batch 16 --seq 1024 --steps 10 --val-batches 1
if python3 -c "import torch, transformers" 2>/dev/null; then
  timeout 240 python3 dev/bench_pytorch_gpu.py --batch 16 --seq 1024 --steps 10 \
    > "$OUT/pytorch.json" 2> "$OUT/pytorch.err" || true
fi

python3 - "$OUT" "${PARITY[@]}" <<'PY'
import json, os, sys
out, entries = sys.argv[1], sys.argv[2:]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": open(os.path.join(out, name.replace(".json", ".err"))).read()[-2000:]
                if os.path.exists(os.path.join(out, name.replace(".json", ".err"))) else str(e)}
PAGE = 2 << 20
pages = lambda b: -(-b // PAGE) * PAGE
report, ok = {"gpu": open(os.path.join(out, "gpu.txt")).read().strip(), "parity": [], "memory": []}, True
for e in entries:
    name = e.split("|")[0]
    g, c = load(f"{name}.cuda.json"), load(f"{name}.cpu.json")
    tol = 1e-3 if "fp32" in name else 2e-2
    row = {"case": name, "tolerance": tol}
    if "error" in g or "error" in c:
        row.update(ok=False, cuda_error=g.get("error"), cpu_error=c.get("error"))
    else:
        worst = 0.0
        for k in ("loss_first", "loss_last", "val_loss"):
            row[k] = {"cuda": g[k], "cpu": c[k]}
            worst = max(worst, abs(g[k] - c[k]) / max(abs(c[k]), 1e-9))
        row.update(worst_relative=worst, ok=worst <= tol)
        mem = {"case": name, "planned_peak": g["planned_peak_bytes"], "measured_peak": g["measured_peak_bytes"],
               "driver": g["driver_bytes"], "expected_driver": pages(g["planned_slab_bytes"]) + pages(g["backend_scratch_bytes"]),
               "context": g["context_bytes"]}
        mem["ok"] = mem["planned_peak"] == mem["measured_peak"] and mem["driver"] == mem["expected_driver"]
        report["memory"].append(mem)
        ok &= mem["ok"]
    ok &= row["ok"]
    report["parity"].append(row)
speed = load("speed.cuda.json")
report["speed"] = {"frugal": speed.get("tokens_per_s"), "frugal_error": speed.get("error"),
                   "pytorch": load("pytorch.json") if os.path.exists(os.path.join(out, "pytorch.json")) else None}
report["ok"] = ok
json.dump(report, open(os.path.join(out, "gpu_check.json"), "w"), indent=2)
md = [f"# frugal CUDA check on {report['gpu']}", "", "| case | tolerance | worst relative | ok |", "|---|---|---|---|"]
md += [f"| {r['case']} | {r['tolerance']} | {r.get('worst_relative', 'error')} | {r['ok']} |" for r in report["parity"]]
md += ["", "| case | planned peak | measured peak | driver bytes | expected | context | ok |", "|---|---|---|---|---|---|---|"]
md += [f"| {m['case']} | {m['planned_peak']} | {m['measured_peak']} | {m['driver']} | {m['expected_driver']} | {m['context']} | {m['ok']} |" for m in report["memory"]]
pt = report["speed"]["pytorch"] or {}
md += ["", "| GPT-2 124M bf16 B16 T1024 | tokens/s |", "|---|---|",
       f"| frugal | {report['speed']['frugal']} |",
       f"| PyTorch eager | {pt.get('eager', {}).get('tokens_per_s')} |",
       f"| torch.compile | {pt.get('compile', {}).get('tokens_per_s')} |"]
open(os.path.join(out, "gpu_check.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if ok else 1)
PY
