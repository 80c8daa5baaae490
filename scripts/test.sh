#!/usr/bin/env bash
# The README's test command: set-up (packages + build), the CI scenario matrix gated against the
# committed golden metrics, then the whole unit-test suite through CTest (its summary last).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build" || exit 2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$here"
echo "== scenario gate: matrix scenarios/ci.toml --golden scenarios/golden/ci"
"$build/resume-harness" matrix scenarios/ci.toml -j "$(nproc)" --golden scenarios/golden/ci \
  --run-dir "$build/ci-run"
matrix_rc=$?
echo "== unit tests (CTest)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 600
ctest_rc=$?
[ $matrix_rc -ne 0 ] && echo "scenario gate FAILED (exit $matrix_rc): see $build/ci-run/summary.csv"
[ $matrix_rc -eq 0 ] && [ $ctest_rc -eq 0 ]
