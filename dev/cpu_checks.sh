# shellcheck shell=bash
# Shared by the checks on other CPUs, dev/emulated_cpus.sh (QEMU) and dev/bochs_cpu.sh (Bochs),
# which source it: the test binaries they run and the text they train on.

# "package target directory executable" for each test binary named in $1 ("package:target ...",
# `lib` for a crate's unit tests), built by `cargo test --release --no-run` with cargo's further
# arguments (`--target T` to build for another architecture). Exits naming what is missing when
# the build fails or a binary is not among its products.
test_bins() {
  local targets=$1 pkgs found
  shift
  pkgs=$(for t in $targets; do echo "-p ${t%%:*}"; done | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2086
  found=$(cargo test --release "$@" $pkgs --no-run --message-format=json | python3 -c '
import json, os, sys
want = set(sys.argv[1].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    # "path+file:///…/crates/linalg#0.1.0", or "…#name@0.1.0" where the folder is named otherwise.
    pid = m["package_id"]
    frag = pid.split("#")[-1]
    pkg = frag.split("@")[0] if "@" in frag else pid.split("#")[0].rstrip("/").rsplit("/", 1)[-1]
    t = m["target"]
    name = "lib" if "lib" in t["kind"] else t["name"]
    if pkg + ":" + name in want:
        print(pkg, name, os.path.dirname(m["manifest_path"]), m["executable"])
' "$targets") || {
    echo "cargo test --no-run failed for $targets" >&2
    exit 1
  }
  local t
  for t in $targets; do
    grep -q "^${t%%:*} ${t#*:} " <<<"$found" || {
      echo "no test binary $t among: $found" >&2
      exit 1
    }
  done
  echo "$found"
}

# The text the checks train on, into file $1: 2,000 short sentences (about 90 KB).
training_text() {
  python3 -c 'import sys; sys.stdout.write(" ".join("the quick brown fox %d jumps over the lazy dog." % i for i in range(2000)))' >"$1"
}
