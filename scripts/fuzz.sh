#!/usr/bin/env bash
# Builds and runs one libFuzzer target (clang 14, ASan + UBSan) for SECONDS seconds, starting from
# the seed corpus tests/fuzz/corpus/TARGET (read-only; new inputs go to BUILD_DIR/fuzz/).
#
#   scripts/fuzz.sh TARGET SECONDS [BUILD_DIR]
#   TARGET: safetensors | manifest | pointer | scenario
#
# safetensors, manifest and pointer build from the LibTorch-free parser sources alone. scenario
# instruments the scenario loader and the config layer and links the rest from BUILD_DIR's
# librh_core.a (built by scripts/setup.sh), so that build must exist.
# FUZZ_RUNS=N stops after N executions instead (SECONDS stays the upper bound on time), so a
# figure such as "1e6 executions, 0 crashes" is measured by FUZZ_RUNS=1000000 scripts/fuzz.sh T 7200.
# Prints executions, crashes and the run's speed; exit 0 when nothing was found, 1 when a crash,
# hang (> 10 s per input), leak or sanitizer report was (its input is under BUILD_DIR/fuzz/).
# Needs: apt-get install -y clang-14 libclang-rt-14-dev
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS [BUILD_DIR]}
secs=${2:?usage: scripts/fuzz.sh TARGET SECONDS [BUILD_DIR]}
build=${3:-$here/build}
cxx=${FUZZ_CXX:-clang++-14}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (apt-get install -y clang-14 libclang-rt-14-dev)"; exit 2; }

ckpt_srcs=(harness/base/input.cpp harness/base/fsutil.cpp harness/base/text.cpp harness/base/no_follow.cpp
           harness/checkpoint/checked_io.cpp harness/checkpoint/safetensors_format.cpp
           harness/checkpoint/manifest_reader.cpp harness/checkpoint/train_state.cpp tests/fuzz/entries_checkpoint.cpp)
case "$target" in
  safetensors) entry=safetensors_header;;
  manifest) entry=manifest;;
  pointer) entry=pointer;;
  scenario) entry=scenario;;
  *) echo "fuzz: unknown target '$target' (safetensors, manifest, pointer, scenario)"; exit 2;;
esac
work=$build/fuzz/$target
mkdir -p "$work/corpus" "$work/artifacts"
bin=$build/fuzz/fuzz_$target
san=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
common=(-std=gnu++17 -O1 -g "${san[@]}" -DRH_FUZZ_ENTRY="$entry" -I"$here")

if [ "$target" != scenario ]; then
  srcs=()
  for s in "${ckpt_srcs[@]}" tests/fuzz/fuzz_target.cpp; do srcs+=("$here/$s"); done
  echo "fuzz: building $bin"
  "$cxx" "${common[@]}" "${srcs[@]}" -lxxhash -o "$bin"   # manifest_reader.cpp hashes with XXH3
  leaks=1
else
  [ -f "$build/compile_commands.json" ] && [ -f "$build/librh_core.a" ] ||
    { echo "fuzz: scenario needs a built $build (scripts/setup.sh $build)"; exit 2; }
  # The gcc build's flags for scenario.cpp (includes, defines) without its precompiled header, and
  # the libraries test_scenario links, without GoogleTest (libFuzzer has the main()).
  mapfile -t cflags < <(python3 - "$build" "$here/harness/verify/scenario.cpp" <<'PY'
import json, shlex, sys
cmds = json.load(open(sys.argv[1] + "/compile_commands.json"))
# The verify room's flags: scenario.cpp's own entry, or its unity batch's (RH_UNITY_BUILD).
cmd = next(c for c in cmds if c["file"] == sys.argv[2] or "/rh_verify.dir/Unity/" in c["file"])
args = shlex.split(cmd["command"])[1:]
out, skip = [], False
for a in args:
    if skip: skip = False; continue
    if a in ("-o", "-c", "-MF", "-MT", "-include"): skip = True; continue
    if a.startswith(("-W", "-O", "-g", "-std=", "-MD", "-fpch", "-Winvalid-pch")) or a == sys.argv[2]: continue
    if a.endswith((".cpp", ".cxx", ".hxx", ".gch")): continue
    out.append(a)
print("\n".join(out))
PY
)
  mapfile -t libs < <(python3 - "$build" <<'PY'
import re, shlex, sys
text = open(sys.argv[1] + "/build.ninja").read()
blk = re.search(r"build tests/tests_harness: CXX_EXECUTABLE_LINKER[^\n]*\n((?:  [^\n]*\n)+)", text).group(1)
libs = re.search(r"  LINK_LIBRARIES = ([^\n]*)", blk).group(1)
for a in shlex.split(libs):
    if "gtest" in a or "gmock" in a: continue
    if not a.startswith("-") and not a.startswith("/"): a = sys.argv[1] + "/" + a
    print(a)
PY
)
  objs=()
  for s in harness/verify/scenario.cpp harness/train/config.cpp harness/base/input.cpp tests/fuzz/entries_scenario.cpp \
           tests/fuzz/fuzz_target.cpp; do
    o=$build/fuzz/obj_$(echo "$s" | tr '/.' '__').o
    if [ ! -f "$o" ] || [ "$here/$s" -nt "$o" ]; then
      echo "fuzz: compiling $s"
      "$cxx" "${common[@]}" "${cflags[@]}" -c "$here/$s" -o "$o"
    fi
    objs+=("$o")
  done
  echo "fuzz: linking $bin"
  "$cxx" "${san[@]}" "${objs[@]}" "${libs[@]}" -o "$bin"
  leaks=0   # LibTorch's own start-up allocations are never freed; nothing of ours is suppressed
fi

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
log=$work/last_run.log
set +e
started=$(date +%s)
"$bin" -max_total_time="$secs" -runs="${FUZZ_RUNS:--1}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -detect_leaks=$leaks \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$here/tests/fuzz/corpus/$target" >"$log" 2>&1
rc=$?
set -e
execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
elapsed=$(( $(date +%s) - started ))
speed=$(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))
found=$(find "$work/artifacts" -type f | wc -l)
echo "fuzz $target: ${execs:-0} executions in ${elapsed} s (${speed:-0}/s), exit $rc, $found artifacts in $work/artifacts"
if [ $rc -ne 0 ] || [ "$found" -ne 0 ]; then
  tail -40 "$log"
  exit 1
fi
