#!/usr/bin/env bash
# Runs every benchmark and prints its figures (ratios, never pass/fail on time).
#   scripts/bench.sh [NAME...]     e.g. scripts/bench.sh bench_optim
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
"$here/scripts/setup.sh" "$build" >/dev/null
cmake --build "$build" --target benches -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# The same kernels the tool pins itself to (harness/train/env.h pin_cross_machine_numerics).
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} RH_NUMERICS_PINNED=1
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(bench_train bench_optim bench_checkpoint bench_load_floor bench_compress bench_check bench_matrix bench_dist bench_external bench_plots bench_report)
for n in "${names[@]}"; do
  echo "== $n"
  if [ -f "$here/bench/$n.py" ]; then /usr/bin/python3 "$here/bench/$n.py"; else "$build/bench/$n"; fi
done
