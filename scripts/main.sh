#!/usr/bin/env bash
# The README's main command: set-up (packages + build), then the default scenario matrix, which
# writes runs/default/ (summary.csv, summary.json, junit.xml, report.md, report.html).
# Extra arguments go to `resume-harness matrix` (e.g. --keep-checkpoints, --filter states/).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build" resume-harness   # the tool only: the tests are the test command's
cd "$here"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec "$build/resume-harness" matrix scenarios/default.toml -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" "$@"
