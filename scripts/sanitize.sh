#!/usr/bin/env bash
# The CI's sanitizer step: builds the base and checkpoint rooms (safetensors and manifest parsers,
# save, load, publish; RH_SANITIZE_ROOMS in CMakeLists.txt) and the parser and checkpoint tests tests/CMakeLists.txt lists in RH_SANITIZER_TESTS
# (label `sanitize`: test_safetensors, test_checkpoint_hostile, test_checkpoint_corruption,
# test_checkpoint_fuzz_corpus, test_checkpoint_compress, test_checkpoint_conformance: every hostile
# input, damaged file, compressed block table and corpus file) with ASan + UBSan (gcc), and runs
# them through CTest. RH_SANITIZE_ALL=1 takes every checkpoint test (round trips, crash points,
# data parallel, the Python reader too: about twice the time). The base room is instrumented too;
# models and optim are linked uninstrumented from the release build's librh_core.a
# (RH_SANITIZE_REUSE), so only the code under test is compiled twice.
# UBSan stops at the first report; leak detection is off because LibTorch never frees its start-up
# allocations (tests/sanitizer_options.cpp); nothing of ours is suppressed.
#
#   scripts/sanitize.sh [RELEASE_BUILD_DIR] [SANITIZER_BUILD_DIR]   (default: build, build-asan-ci)
#
# The full instrumented build (every room) is the "asan" CMake preset.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
release=${1:-$here/build}
build=${2:-$here/build-asan-ci}
[ -f "$release/librh_core.a" ] || { echo "sanitize: no $release/librh_core.a (run scripts/setup.sh $release first)"; exit 2; }
all=OFF
[ "${RH_SANITIZE_ALL:-0}" = 1 ] && all=ON
start=$(date +%s)
mkdir -p "$build"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRH_SANITIZE=ON \
  -DRH_SANITIZE_REUSE="$release" -DRH_SANITIZE_ALL=$all > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "sanitize: configure failed"; exit 2; }
cmake --build "$build" -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" || { echo "sanitize: build failed"; exit 2; }
built=$(date +%s)
cd "$build"
ctest --output-on-failure -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --timeout 900
rc=$?
echo "sanitize: build $((built - start)) s, tests $(( $(date +%s) - built )) s, ctest exit $rc"
exit $rc
