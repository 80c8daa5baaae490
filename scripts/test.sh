#!/usr/bin/env bash
# The README's test command: set-up (packages + build), the CI scenario matrix gated against the
# committed golden metrics, the external-trainer matrix (scenarios/external.toml), the parser and checkpoint tests under ASan + UBSan (scripts/sanitize.sh;
# RH_SKIP_SANITIZE=1 skips it for a quick local run), then the whole unit-test suite through CTest
# (its summary last).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
t0=$(date +%s); t=$t0
step_time() { local now; now=$(date +%s); echo "== $1: $((now - t)) s"; t=$now; }   # CI time per step
"$here/scripts/setup.sh" "$build" || exit 2
step_time "set-up (packages, build)"
# GNU nproc honours OMP_NUM_THREADS, set to 1 here for the tool's processes: count the cores
# without it (with it, the matrices, the sanitizer build and CTest all ran on one core).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$here"
echo "== scenario gate: matrix scenarios/ci.toml --golden scenarios/golden/ci"
"$build/resume-harness" matrix scenarios/ci.toml -j "$cores" --golden scenarios/golden/ci \
  --run-dir "$build/ci-run"
matrix_rc=$?
step_time "scenario gate"
echo "== external trainers: matrix scenarios/external.toml (examples/tiny_lm and the tool itself)"
"$build/resume-harness" matrix scenarios/external.toml -j "$cores" --run-dir "$build/external-run" --no-report
external_rc=$?
step_time "external trainers"
san_rc=0
if [ "${RH_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== parser and checkpoint tests under ASan + UBSan: scripts/sanitize.sh"
  "$here/scripts/sanitize.sh" "$build" "${build}-asan-ci" > "$build/sanitize.log" 2>&1
  san_rc=$?
  grep -E "tests passed|tests failed|^sanitize:" "$build/sanitize.log"
  [ $san_rc -ne 0 ] && tail -60 "$build/sanitize.log"
  step_time "sanitizer step"
fi
echo "== unit tests (CTest)"
cd "$build"
ctest --output-on-failure -j "$cores" --timeout 600
ctest_rc=$?
step_time "unit tests"
echo "== total: $(( $(date +%s) - t0 )) s"
[ $matrix_rc -ne 0 ] && echo "scenario gate FAILED (exit $matrix_rc): see $build/ci-run/summary.csv"
[ $external_rc -ne 0 ] && echo "external trainers FAILED (exit $external_rc): see $build/external-run/summary.csv"
[ $san_rc -ne 0 ] && echo "sanitizer step FAILED (exit $san_rc): see $build/sanitize.log"
[ $matrix_rc -eq 0 ] && [ $external_rc -eq 0 ] && [ $san_rc -eq 0 ] && [ $ctest_rc -eq 0 ]
