#!/usr/bin/env bash
# The README's test command: set-up (packages + build), then the whole test suite through CTest,
# then the CI scenario matrix gated against the committed golden metrics.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build"
cd "$build"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ctest --output-on-failure -j "$(nproc)" --timeout 600
