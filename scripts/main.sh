#!/usr/bin/env bash
# The README's main command: set-up (packages + build), then the main job.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build"
cd "$here"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"$build/resume-harness" train --out reports/runs/default-train "$@"
