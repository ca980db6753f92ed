#!/usr/bin/env bash
# Runs the same short jobs with two frugal binaries and diffs what they print: losses, planned and
# measured bytes, plans and generated text must be identical after a refactor. Timings are dropped
# (they differ run to run).
#
#   dev/compare_binaries.sh OLD_BINARY NEW_BINARY [WORKDIR]
#
# Each binary trains its own small model for the generation checks, so the two sides share nothing.
set -euo pipefail
old="$(realpath "$1")"
new="$(realpath "$2")"
work="${3:-$(mktemp -d)}"
mkdir -p "$work"

# Drops the keys that hold wall-clock time or the process's resident memory (both differ run to
# run), so the rest can be compared byte for byte.
strip_times() {
  python3 -c '
import json, sys
def walk(v):
    if isinstance(v, dict):
        return {k: walk(x) for k, x in v.items()
                if not any(t in k for t in ("per_s", "seconds", "_ms", "elapsed", "wall", "time", "blocked_s", "rss"))}
    if isinstance(v, list):
        return [walk(x) for x in v]
    return v
print(json.dumps(walk(json.load(sys.stdin)), indent=1, sort_keys=True))'
}

run_side() {
  local bin="$1" out="$2"
  mkdir -p "$out"
  local short=(--steps 6 --batch 2 --seq 32 --val-every 3 --val-batches 1 --sample-tokens 0 --json)
  local -A train=(
    [fp32]="--model gpt2-tiny"
    [bf16]="--model llama-tiny --precision bf16 --recompute sqrt"
    [zero3]="--model gpt2-tiny --ranks 2 --zero 3"
    [lora_nf4]="--model llama-tiny --lora-rank 4 --lora-base nf4 --double-quant"
    [tp2]="--model llama-tiny --ranks 2 --tp 2 --sp"
    [mixtral]="--model mixtral-tiny"
    [deepseek]="--model deepseek-tiny"
  )
  for name in "${!train[@]}"; do
    # shellcheck disable=SC2086
    "$bin" train ${train[$name]} "${short[@]}" | strip_times > "$out/train_$name.json"
  done
  local -A plans=(
    [llama3_8b_zero3]="--model llama3-8b --train --zero 3 --gpus 8 --batch 4 --seq 2048"
    [llama2_7b_lora]="--model llama2-7b --train --lora-rank 16 --lora-base nf4 --batch 1 --seq 1024"
    [gpt2_pytorch]="--model gpt2-124m --train --runtime pytorch --batch 8 --seq 1024"
    [mixtral_infer]="--model mixtral-8x7b --weights int4 --batch 8 --seq 4096"
    [deepseek_infer]="--model deepseek-v2-lite --batch 4 --seq 8192 --kv-dtype int8"
    [llama_tp]="--model llama2-13b --train --tp 4 --sp --gpus 8 --batch 2 --seq 4096"
    [llama_infer_frugal]="--model llama2-7b --infer --runtime frugal --weights int4 --kv-dtype int8 --batch 4 --seq 2048"
    [gpt2_infer_frugal]="--model gpt2-124m --infer --runtime frugal --weights f32 --batch 1 --seq 512"
  )
  for name in "${!plans[@]}"; do
    # shellcheck disable=SC2086
    "$bin" plan ${plans[$name]} --json | strip_times > "$out/plan_$name.json"
  done
  "$bin" train --model gpt2-tiny --steps 150 --batch 4 --seq 64 --sample-tokens 0 --val-batches 1 \
    --out "$out/model" > /dev/null
  local gen=(generate --model "$out/model" --prompt "ROMEO:" --max-new-tokens 24 --top-k 40 --seed 3 --json)
  "$bin" "${gen[@]}" --weights int4 | strip_times > "$out/generate_int4.json"
  "$bin" "${gen[@]}" --kv-dtype int8 | strip_times > "$out/generate_kv8.json"
  "$bin" "${gen[@]}" --draft "$out/model" --draft-weights int4 | strip_times > "$out/generate_spec.json"
  # The model folder differs in nothing that matters, but its path does: keep only the outputs.
  rm -rf "$out/model"
}

run_side "$old" "$work/old"
run_side "$new" "$work/new"
same=0
for f in "$work"/old/*.json; do
  name="$(basename "$f")"
  if cmp -s "$f" "$work/new/$name"; then
    same=$((same + 1))
  else
    echo "DIFFERS: $name"
    diff "$f" "$work/new/$name" | head -20 || true
  fi
done
echo "$same of $(ls "$work"/old/*.json | wc -l) outputs identical ($work)"
[ "$same" -eq "$(ls "$work"/old/*.json | wc -l)" ]
