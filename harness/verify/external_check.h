// The resume check of an external trainer's cell (a scenario with [trainer]; external.h). It runs
// the user's command as separate processes in the cell's directory:
//   uninterrupted_1..D   0..N, `determinism_runs` times (compared with each other first)
//   interrupted          {iterations} = K: trains to K and saves
//   resumed              resume_command to N; its {save_dir} starts as a copy of the interrupted
//                        run's, {load_dir} names that saved directory
//   round_trip           (trainer.round_trip) resume_command with {iterations} = K: load, train
//                        nothing, save
// then compares every logged metric row by iteration number (printed text bit for bit, parsed value
// for |diff|), the checkpoints (at K when checkpoint.path holds {iteration}, the round trip, and at
// N), and the probe's records (rhckpt.probe: metrics as hex floats and a hash of every tensor and
// RNG state, per iteration and right after load), and names the first divergence with a diagnosis
// in words, in this order: nondeterministic -> before-save -> saved-state -> round-trip ->
// after-load -> not-in-checkpoint / resumed-metrics -> final-state (diagnosis.h).
// Checkpoints: safetensors are read here; torch.save files (and directories of them) are turned
// into one flat safetensors file by python/rhckpt/torch_bridge.py (restricted unpickler) only when
// the two files compared are not byte-identical.
#pragma once
#include "harness/verify/check.h"

namespace rh {

// Runs and compares one external cell in opts.work_dir (which must exist and be empty); never
// throws for a trainer's failure (an "error" outcome naming the run and its stderr's tail).
CheckResult check_external_cell(const Scenario& scenario, const CheckOptions& opts);

// Where python/rhckpt lives: $RH_PYTHON_DIR, else python/ in the tool's data directory
// (harness/base/data_files.h: build/share/resume-harness in a build tree, <prefix>/share/resume-harness
// in an install); "" if it has no rhckpt/.
std::string python_package_dir();
// The Python interpreter for the bridge: $RH_PYTHON, else /usr/bin/python3 (Debian's, with torch).
std::string python_interpreter();

}   // namespace rh
