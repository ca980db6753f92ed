#!/usr/bin/env bash
# The kernel and training-step tests, and a few runs of the binary, on CPUs this machine is not,
# under QEMU's user-mode emulators. The binaries detect the emulated CPU, so every level is
# picked by detection rather than by FRUGAL_ISA, and any instruction above the CPU (this
# project's or a crate's) stops the run with SIGILL.
#
#   EPYC-Milan  AMD Zen 3: AVX2, FMA, F16C, no AVX-512 (the common AVX2-only server)
#   Nehalem     SSE4.2 only: the portable paths (old servers, VMs with a baseline CPU model)
#   aarch64     64-bit Arm (Graviton, Apple silicon under Linux): built for
#               aarch64-unknown-linux-gnu and run by qemu-aarch64
#
# Usage: dev/emulated_cpus.sh [MODEL...]   (default: all three). Needs qemu-user and python3;
# aarch64 also the cross linker and C library (Debian: gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross) and rustup's aarch64-unknown-linux-gnu target. Builds the release
# binaries it runs. Exit 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(EPYC-Milan Nehalem aarch64)

# shellcheck source=dev/cpu_checks.sh
. dev/cpu_checks.sh
# The test binaries: the kernels (linalg, kernels), the inference worker and the training step's
# allocation check.
targets="linalg:lib kernels:lib kernels:levels infer:lib infer:allocations infer:tiles engine:lib
train:allocations"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc

for model in "${models[@]}"; do
  case $model in
    aarch64) need="qemu-aarch64 aarch64-linux-gnu-gcc" ;;
    *) need=qemu-x86_64 ;;
  esac
  for tool in $need; do
    command -v "$tool" >/dev/null || {
      echo "$model needs $tool: apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
      exit 1
    }
  done
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A small text to train on, and weights to generate from: three steps of fp32 on this CPU.
training_text "$work/data.txt"
out="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -p frugal
native="$out/release/frugal"
"$native" train --model gpt2-tiny --data "$work/data.txt" --steps 3 --batch 2 --seq 32 \
  --sample-tokens 0 --val-batches 1 --out "$work/base" --json >/dev/null

fail=0
for model in "${models[@]}"; do
  if [ "$model" = aarch64 ]; then
    target=aarch64-unknown-linux-gnu
    emu=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
    cargo build --release --target "$target" -p frugal
    frugal="$out/$target/release/frugal"
    bins=$(test_bins "$targets" --target "$target")
  else
    emu=(qemu-x86_64 -cpu "$model")
    frugal="$native"
    bins=$(test_bins "$targets")
  fi
  # The level the binary detects must be the emulated CPU's: an emulator without AVX2 (QEMU
  # before 7.2) would run the Zen 3 as a portable CPU and test nothing of AVX2.
  expect=portable
  [ "$model" = EPYC-Milan ] && expect=avx2
  level=$("${emu[@]}" "$frugal" bench train --model gpt2-tiny --batch 1 --seq 16 --steps 1 --json \
    </dev/null 2>"$work/err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["isa"])' \
    2>/dev/null) || level="none ($(tail -2 "$work/err"))"
  if [ "$level" != "$expect" ]; then
    echo "FAIL  $model: the binary detects $level, not $expect"
    fail=1
    continue
  fi
  echo "== $model: the binary detects $level"
  while read -r pkg _ dir exe; do
    start=$SECONDS
    # The emulator's CPUID names the emulated vendor while /proc/cpuinfo names the host's.
    if (cd "$dir" && "${emu[@]}" "$exe" --test-threads 2 --skip amd_is_the_vendor_the_kernel_names \
      </dev/null >"$work/out" 2>&1); then
      echo "ok    $pkg $(basename "$exe") ($((SECONDS - start)) s): $(grep '^test result' "$work/out" | tail -1)"
    else
      echo "FAIL  $pkg $(basename "$exe") ($((SECONDS - start)) s)"
      grep -E "FAILED|panicked|SIGILL|Illegal|signal" "$work/out" | head -20 || true
      fail=1
    fi
  done <<<"$bins"
  # End to end: three steps of fp32 and bf16 training, int4 and int8 generation; each must give
  # the same loss or tokens as the same command on this CPU capped at the emulated CPU's level.
  for run in fp32 bf16 int4 int8; do
    case $run in
      fp32 | bf16) args=(train --model gpt2-tiny --data "$work/data.txt" --steps 3 --batch 2 --seq 32
        --sample-tokens 0 --val-batches 1 --precision "$run" --json) key=loss_last ;;
      *) args=(generate --model "$work/base" --prompt "ROMEO:" --max-new-tokens 6 --weights "$run"
        --kv-dtype int8 --json) key=tokens ;;
    esac
    if ! "${emu[@]}" "$frugal" "${args[@]}" </dev/null >"$work/emu.json" 2>"$work/err"; then
      echo "FAIL  frugal ${args[0]} $run under $model: $(tail -3 "$work/err")"
      fail=1
      continue
    fi
    if ! FRUGAL_ISA="$level" "$native" "${args[@]}" </dev/null >"$work/native.json" 2>"$work/err"; then
      echo "FAIL  frugal ${args[0]} $run on this CPU at $level: $(tail -3 "$work/err")"
      fail=1
      continue
    fi
    field='import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))'
    got=$(python3 -c "$field" "$work/emu.json" "$key")
    want=$(python3 -c "$field" "$work/native.json" "$key")
    if [ "$got" = "$want" ] && [ "$got" != None ]; then
      echo "ok    frugal ${args[0]} $run: $key $got, as this CPU capped at $level"
    else
      echo "FAIL  frugal ${args[0]} $run: $key $got under $model, $want on this CPU capped at $level"
      fail=1
    fi
  done
done
exit $fail
