// One training process as the tool runs it: fresh or resumed from a checkpoint, optionally
// stopping early and saving (one or several checkpoints of the same state), writing metrics,
// timing and per-iteration fingerprints into an output directory. A resumed run also writes
// load_result.json: whether the checkpoint loaded, and if not, why. The resume check
// (verify/check.h) reads these files; it never reads a log.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/train/config.h"
#include "harness/train/fault.h"
#include "harness/train/load_result.h"
#include "harness/train/save_plan.h"

namespace rh {

struct TrainJob {
  RunConfig cfg;
  std::string out_dir;             // metrics.csv, timing.csv, fingerprints.csv, config.json
  int64_t stop_at = -1;            // stop after this iteration (-1: cfg.train.iterations)
  std::vector<SaveTarget> saves;   // written when stopping, or at save_at
  int64_t save_at = -1;            // save after this iteration, then go on
  std::string load;                // if set: resume from this checkpoint root or iter_ directory
  Fault fault = Fault::none;
  bool allow_lossy = false;               // accept lossy conversions on load
  bool exact_master_conversion = false;   // LoadOptions::exact_master_conversion
  bool exact_rebucket = false;            // LoadOptions::exact_rebucket
  bool dump_states = false;               // write state dumps (at save / right after load) for comparison
  bool quiet = false;
  bool verbose = false;                 // -v: also bytes per key of each save and seconds per phase
  bool remainders_flag_given = false;   // --store-param-remainders on the command line: say if it has no effect
  // Data parallel: the placement comes from the environment (torchrun / SLURM variables, or the
  // `--nproc` launcher, see ranks/group.h and ranks/launcher.h); rendezvous and every collective
  // time out after this.
  double dist_timeout_s = 120;
};

// Runs the job; returns the process exit code (0 ok). Throws on bad input. Data parallel: every
// rank runs this; rank 0 writes the outputs (fingerprints of the other ranks' optimizer parts
// gathered under "<key>@rank<r>"), every rank writes its checkpoint shard.
int run_train(const TrainJob& job);

}   // namespace rh
