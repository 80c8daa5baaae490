// External trainers: a scenario that names a user's own training command instead of the built-in
// model. This header holds what a scenario file says about it (the [trainer] table, documented in
// scenarios/README.md) and the placeholder rule of its commands and paths; external_check.h runs
// it, external_metrics.h reads what it logs. LibTorch-free.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rh {

struct ExternalTrainer {
  std::vector<std::string> command;   // the uninterrupted and interrupted runs, e.g. {"python3", "train.py", ...}
  std::vector<std::string> resume_command;   // the resumed run (and the round trip)
  std::vector<std::string> args;             // appended to both commands; matrix axes append to it
  std::string cwd;   // where the commands run; relative to the scenario file's directory; "" = the cell's
  std::vector<std::pair<std::string, std::string>> env;   // added to the environment of every run
  double timeout_s = 600;                                 // per run; the whole process group is killed
  uint64_t output_cap_bytes = 64ull << 20;                // stdout + stderr kept per run; more kills the run
  int determinism_runs = 2;                               // uninterrupted runs compared with each other first
  bool round_trip = false;   // also: load K, train nothing, save; compare with what was loaded
  bool probe = false;        // set RH_PROBE_DIR: the trainer's rhckpt.probe calls record
  bool probe_auto = false;   // probe = "auto": python/rhckpt/autoprobe.py records without the trainer's calls
  // Not bitwise reproducible (GPU kernels): the runs are judged against the run-to-run spread of
  // determinism_runs uninterrupted runs, a difference beyond noise_factor times it diverging.
  bool noise = false;
  double noise_factor = 3;
  struct Metrics {
    std::string stdout_regex;   // with (?P<iteration>...) and one named group per metric
    std::string file;           // or a file the trainer writes (placeholders allowed)
    std::string format;         // "csv" | "jsonl" (file only)
  } metrics;
  struct Checkpoint {
    std::string path;              // "" = checkpoints are not compared; {iteration} names one per iteration
    std::string format = "auto";   // "auto" | "safetensors" | "torch"
    bool trust_pickle = false;     // torch files: full unpickling (runs code from the file)
    // Saved keys left out of every comparison (a time, a host name), each with its reason; `key`
    // is a glob ('*' any run of characters, '/' included; '?' one).
    struct Ignore {
      std::string key, reason;
    };
    std::vector<Ignore> ignore;
  } checkpoint;
  std::string scenario_dir;   // the scenario file's directory (cwd is relative to it)
  std::string preset;         // "" or "megatron" (apply_preset)
};

// trainer.preset = "megatron", applied where the preset is given (before that table's other keys,
// which override it): Megatron-LM's log line as metrics.stdout_regex, checkpoint.path
// "{save_dir}/iter_{iteration:07}" (format auto: the legacy torch layout or torch_dist), and the
// inherited resume_command cleared.
void apply_preset_defaults(ExternalTrainer& t, const std::string& preset);
// After every table: the preset's flags appended to trainer.args where neither command names them
// (--exit-interval {iterations} --save-interval {save_at} --save {save_dir} --load {load_dir}
// --log-interval 1), and resume_command = command when none was given.
void finish_preset(ExternalTrainer& t);
// Megatron-LM's training_log line (megatron/training/training.py, main 001b00c): " [time]
// iteration 10/ 20 | ... | learning rate: 3.000000E-04 | ... | lm loss: 4.771394E+00 | ...".
extern const char* const kMegatronLogRegex;

// Names a template may use: {iterations} {save_at} {save_dir} {load_dir} {run_dir} {tool}, and
// {iteration} in checkpoint.path; "{{" and "}}" are literal braces; an integer placeholder may be
// zero-padded as {iteration:07}. Values missing from `vars` are an error.
std::string expand_placeholders(const std::string& text, const std::map<std::string, std::string>& vars);
// Throws std::invalid_argument naming the first placeholder not in `allowed` (or a bad brace).
void check_placeholders(const std::string& text, const std::vector<std::string>& allowed);

// Checks a complete trainer table (commands given, exactly one metrics source, a regex that
// compiles with an iteration group, known formats); throws std::invalid_argument "key: what".
void validate_trainer(const ExternalTrainer& t);

}   // namespace rh
