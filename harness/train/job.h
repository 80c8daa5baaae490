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

namespace rh {

// Deliberate faults the resume check must catch. Each one omits or breaks one piece of restore.
enum class Fault {
  none,
  skip_rng_restore,            // generators keep their fresh state
  skip_data_position_restore,  // data restarts at sample 0
  reset_step_counter,          // optimizer step counters back to 0
  skip_exp_avg_restore,        // exp_avg stays at its fresh value (0)
  reset_lr_schedule,           // scheduler counter (num_steps) back to 0
  drop_remainders,             // load weights only: remainders stay 0
  reset_wd_schedule,           // the scheduler's weight-decay part falls back to a constant
                               // optimizer.weight_decay (start = end = it, style constant)
  wrong_lr_decay_style,        // the LR schedule is saved, but restored with another decay style
                               // (cosine <-> linear, any other -> cosine), past upstream's check
  skip_expert_bias_restore,    // the model's persistent buffers (routers' expert_bias) keep their
                               // fresh value (0)
};
std::string to_string(Fault f);
Fault parse_fault(const std::string& s);   // throws std::invalid_argument listing the names
const std::vector<std::string>& fault_names();

// One checkpoint to write: where, and how (policy, per-key overrides, compression).
struct SaveTarget {
  std::string root;
  ckpt::SavePolicy policy;
};

// The save plan file (`train --save-plan FILE`): several checkpoints of the same state, written one
// after the other at the same iteration, so the matrix trains a baseline once for every cell that
// differs only in how it saves. {"schema_version": 1, "saves": [{"root": "...", "policy": "native",
// "overrides": {"exp_avg_sq": "bf16"}, "compress": "none"}, ...]}. Throws std::invalid_argument
// naming the file and the entry.
constexpr int kSavePlanSchema = 1;
std::vector<SaveTarget> read_save_plan(const std::string& path);
void write_save_plan(const std::string& path, const std::vector<SaveTarget>& saves);

// load_result.json, written by a run with --load into its output directory: {"schema_version": 1,
// "status": "loaded" | "refused", "checkpoint": "<--load>", "iteration": K, "conversions": [...]}
// or, refused, "error_kind" (checkpoint | input | peer | internal), "file", "tensor" (where known)
// and "message" (the error the process exits with).
constexpr int kLoadResultSchema = 1;
constexpr const char* kLoadResultFile = "load_result.json";
struct LoadResult {
  bool loaded = false;
  std::string checkpoint, error_kind, file, tensor, message;
  int64_t iteration = -1;
  std::vector<std::string> conversions;
};
// Throws std::runtime_error naming the file when it is missing, malformed or of another schema.
LoadResult read_load_result(const std::string& path);

struct TrainJob {
  RunConfig cfg;
  std::string out_dir;            // metrics.csv, timing.csv, fingerprints.csv, config.json
  int64_t stop_at = -1;           // stop after this iteration (-1: cfg.train.iterations)
  std::vector<SaveTarget> saves;  // written when stopping, or at save_at
  int64_t save_at = -1;           // save after this iteration, then go on
  std::string load;               // if set: resume from this checkpoint root or iter_ directory
  Fault fault = Fault::none;
  bool allow_lossy = false;       // accept lossy conversions on load
  bool exact_master_conversion = false;   // LoadOptions::exact_master_conversion
  bool dump_states = false;       // write state dumps (at save / right after load) for comparison
  bool quiet = false;
  bool verbose = false;           // -v: also bytes per key of each save and seconds per phase
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

}  // namespace rh
