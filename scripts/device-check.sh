#!/usr/bin/env bash
# The checks that need a GPU machine with torch 2.x, as one short script (a few minutes on 16
# cores): run it through the device tool when a session is lent one, e.g.
#   run  command="scripts/device-check.sh"  timeout_s=540
# Each step writes its log to $OUT (or /tmp/device-check when $OUT is unset) and one line
# "device-check: STEP ok|FAILED|skipped (why)" to stdout; the exit code is the number of failed
# steps. Nothing here is needed for the CPU build or CI.
#
#   1. configure and build against the device's CUDA LibTorch (torch.utils.cmake_prefix_path of
#      the Python that has torch 2.x), so the CUDA code paths compile (RH_WITH_CUDA);
#   2. the GPU tests (tests/optim/test_optim_te_gpu.cpp against TransformerEngine's FusedAdam when
#      it is installed; CTest skips them, exit 77, without it) and one built-in check on cuda;
#   3. torch.distributed.checkpoint fixtures written by torch 2.x's own writer (dcp.save), read
#      by `resume-harness inspect` (the newer module's class paths, Megatron's torch_dist layout);
#   4. the automatic probe on torch 2.x: the tiny-lm auto-probe cells of scenarios/external.toml
#      with that Python (their optimizer hooks differ from torch 1.13's).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
build=$here/build-device
jobs=$(env -u OMP_NUM_THREADS nproc)
failed=0
step() {   # step NAME COMMAND...: runs COMMAND with its output in $out/NAME.log
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "$@" > "$out/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then echo "device-check: $name ok ($(( $(date +%s) - t0 )) s)"
  elif [ $rc -eq 77 ]; then echo "device-check: $name skipped ($(tail -1 "$out/$name.log"))"
  else echo "device-check: $name FAILED (exit $rc, $(( $(date +%s) - t0 )) s); last lines:"; tail -15 "$out/$name.log"
       failed=$((failed + 1)); fi
  return 0
}

# The Python with torch 2.x: $RH_PYTHON, else the first of python3 / /usr/bin/python3 that has it.
py=""
for cand in ${RH_PYTHON:-} python3 /usr/bin/python3; do
  v=$("$cand" -c 'import torch; print(torch.__version__)' 2>/dev/null) || continue
  case "$v" in 2.*|3.*) py=$cand; break;; esac
done
if [ -z "$py" ]; then
  echo "device-check: no Python with torch >= 2 found (tried \$RH_PYTHON, python3, /usr/bin/python3)"
  exit 1
fi
prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' \
  | tee "$out/environment.txt"
nvidia-smi -L >> "$out/environment.txt" 2>&1 || true

step configure cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
grep -q "CUDA paths: ON" "$out/configure.log" || echo "device-check: note: the LibTorch found has no CUDA (see configure.log)"
step build cmake --build "$build" -j "$jobs" --target resume-harness tests_optim
export OMP_NUM_THREADS=1 RH_PYTHON="$py"
if [ -x "$build/resume-harness" ]; then
  step gpu-tests ctest --test-dir "$build" --output-on-failure -R "TeGpu|te_gpu|Cuda|cuda"
  step cuda-check "$build/resume-harness" check 'states/moments=bf16,master=remainders,policy=per_key' \
    --device cuda --run-dir "$out/cuda-check"
else
  echo "device-check: gpu-tests, cuda-check skipped (no tool built)"
fi

# DCP fixtures from torch 2.x's own writer, then what the tool reads from them.
dcp=$out/dcp
step dcp-write "$py" - "$dcp" <<'PY'
import sys, torch
import torch.distributed.checkpoint as dcp
root = sys.argv[1]
torch.manual_seed(0)
state = {"model": {"w": torch.randn(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16)},
         "optimizer": {"state": {"0": {"exp_avg": torch.randn(4, 3), "step": torch.tensor(10.0)}}},
         "iteration": 10}
for name, edit in (("a", None), ("b", (1, 2))):
    s = {"model": {k: v.clone() for k, v in state["model"].items()},
         "optimizer": state["optimizer"], "iteration": 10}
    if edit: s["model"]["w"][edit] += 1.0
    dcp.save(s, checkpoint_id=f"{root}/{name}")   # no process group: torch >= 2.2 saves single-process
print("wrote", root + "/a", root + "/b")
PY
if [ -x "$build/resume-harness" ] && [ -d "$dcp/a" ]; then
  step dcp-inspect "$build/resume-harness" inspect "$dcp/a"
  grep -q "model.w\|model/w" "$out/dcp-inspect.log" || { echo "device-check: dcp-inspect: model.w not listed"; failed=$((failed + 1)); }
fi

# The automatic probe on torch 2.x: the external matrix's tiny-lm auto-probe cells with that Python.
if [ -x "$build/resume-harness" ]; then
  sed "s#/usr/bin/python3#$py#g" "$here/scenarios/external.toml" > "$out/external-device.toml"
  step autoprobe "$build/resume-harness" matrix "$out/external-device.toml" --filter '*auto-probe*' \
    -j 4 --run-dir "$out/autoprobe-run" --no-report
fi
echo "device-check: $failed step(s) failed; logs in $out"
exit $failed
