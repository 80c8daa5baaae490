#!/usr/bin/env bash
# Installs every Debian package resume-harness needs on a fresh Debian 12 machine, then
# configures and builds the project. Idempotent: a second run installs nothing and rebuilds only
# what changed. Used by both README commands and by .ci/run.
#
#   scripts/setup.sh [BUILD_DIR [TARGET...]]      (default: build, every target)
#
# With TARGETs only those are built (scripts/main.sh builds the tool alone, so its first report
# does not wait for the tests and benchmarks; scripts/test.sh builds everything).
# Extra CMake arguments go through $CMAKE_ARGS, e.g. CMAKE_ARGS="-DCMAKE_PREFIX_PATH=/opt/torch".
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
targets=("${@:2}")

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread
  libeigen3-dev libfccp-dev libgtest-dev
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libxxhash-dev libzstd-dev libre2-dev
  python3-matplotlib python3-numpy python3-xxhash python3-zstandard
  python3-venv python3-pip python3-setuptools   # tests/test_install.py: pip install ./python into a venv
  python3-torch   # python/rhckpt/torch_bridge.py, examples/tiny_lm, tests/test_{torch_bridge,probe,tiny_lm}.py
  chromium   # tests/test_report_browser.py renders report.html headless
  python3-yaml curl unzip   # tests/test_ci_recipes.py: parses examples/ci/*.yml and runs their steps (GitLab's fetches with curl, unzip)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
mkdir -p "$build"
# Each step's output goes to a log in the build directory; the terminal gets one line per step,
# and the log's tail when a step fails.
run_logged() {   # run_logged LOG WHAT COMMAND...
  local log=$1 what=$2 t0 rc=0
  shift 2
  t0=$(date +%s)
  "$@" > "$log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    echo "setup: $what FAILED (exit $rc); the last lines of $log:"
    tail -40 "$log"
    exit $rc
  fi
  echo "setup: $what done in $(( $(date +%s) - t0 )) s (log: $log)"
}
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  run_logged "$build/setup-packages.log" "package installation" \
    bash -c "$sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends ${missing[*]}"
fi

# Debian's LibTorch links libblas.so.3; OpenBLAS must be the alternative that provides it, or
# every matmul runs on the reference BLAS (about 12x slower). The tool also checks at start-up.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) echo "setup: BLAS is OpenBLAS ($blas)";;
  *) echo "setup: WARNING libblas.so.3 resolves to '$blas', not OpenBLAS; selecting OpenBLAS"
     for alt in /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3; do
       [ -e "$alt" ] && update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" || true
     done;;
esac

run_logged "$build/setup-configure.log" "configure" \
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
run_logged "$build/setup-build.log" "build ($build${targets:+: ${targets[*]}})" \
  cmake --build "$build" -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" "${target_args[@]}"
