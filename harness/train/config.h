// The run configuration: model, optimizer and trainer settings, filled once at the edge (command
// line, scenario TOML, checkpoint manifest) and passed down read-only. Every field is declared once
// in config.cpp's field table, which drives the command-line flags, the JSON form (manifests) and
// the TOML form (scenarios, through SectionSettings), so the three can never disagree.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "harness/optim/precision_adam.h"
#include "models/model.h"

namespace CLI {
class App;
}

namespace rh {

struct TrainConfig {
  int64_t iterations = 20;     // N: the run's length (a run may stop earlier, see --stop-at)
  int64_t global_batch = 16;   // samples per iteration, independent of micro-batching
  int64_t micro_batch = 8;     // samples per forward/backward; gradients accumulate
  double lr = 1e-2;            // peak learning rate
  double min_lr = 1e-3;        // cosine floor
  int64_t lr_warmup_iters = 2;
  int64_t lr_decay_iters = 20;                        // schedule length, fixed by config, not by where a run stops
  double lr_warmup_init = 0.0;                        // LR at warmup's start (Megatron --lr-warmup-init)
  std::string lr_decay_style = "cosine";              // constant | linear | cosine | inverse-square-root | WSD
                                                      // (Megatron's default is linear; ours stays cosine)
  std::string lr_wsd_decay_style = "exponential";     // WSD anneal: exponential | linear | cosine | minus_sqrt
  int64_t lr_wsd_decay_iters = -1;                    // WSD anneal length in iterations (-1: unset; WSD needs it)
  double start_weight_decay = -1;                     // weight-decay schedule start (-1: optimizer.weight_decay)
  double end_weight_decay = -1;                       // and end (-1: optimizer.weight_decay)
  std::string weight_decay_incr_style = "constant";   // constant | linear | cosine
  // On resume (Megatron's flags, at most one): take the scheduler values of this run, or of the
  // checkpoint; with neither they must agree (upstream _check_and_set refuses a mismatch).
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  double clip_grad = 1.0;       // global-norm clipping threshold (0 = off)
  uint64_t seed = 1234;         // parameter init and the dropout generator
  uint64_t data_seed = 42;      // the synthetic corpus
  int64_t threads = 1;          // intra-op threads (fixed for determinism)
  std::string device = "cpu";   // cpu | cuda
};

struct RunConfig {
  models::ModelConfig model;
  optim::OptimizerConfig optim;
  TrainConfig train;
};

// Caps on what a config may ask for (bad input beyond them, exit 2).
constexpr int64_t kMaxThreads = 256;
constexpr int64_t kMaxIterations = 10'000'000;
constexpr int64_t kMaxBatch = 1 << 20;
constexpr double kMaxParams = 4e9;
constexpr uint64_t kMaxConfigBytes = 16u << 20;

// Checks every field against its own range or choices from the field table (the caps above among
// them), in table order, then the combinations (batch divisibility, the schedule, the parameter
// count, models::validate_config, Megatron's optimizer rules), and throws std::invalid_argument
// naming the field: "train.iterations (--train-iters) must be in [1, 10000000], got 0".
void validate(const RunConfig& cfg);

nlohmann::json to_json(const RunConfig& cfg);
// Strict: unknown sections or keys, and values of the wrong type, throw std::invalid_argument
// naming `where` (a file name or "manifest") and the key.
RunConfig run_config_from_json(const nlohmann::json& j, const std::string& where);
// Reads a run-config JSON file (config.json or the run_config of a manifest). keys_given, if not
// null, receives "section.key" of every key the file sets.
RunConfig load_run_config_file(const std::string& path, std::set<std::string>* keys_given = nullptr);
// Applies the keys present in j (sections model/optimizer/train) on top of cfg.
void apply_json(RunConfig& cfg, const nlohmann::json& j, const std::string& where);

// One value a file gives for a setting, in the file's own form (a JSON config or manifest, a TOML
// scenario) but without its parser's types: the field table checks it against the field's type.
struct SettingValue {
  // monostate: no scalar (an array, a table, a date, null); uint64_t: an integer above INT64_MAX
  // (JSON only); every other integer is int64_t.
  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string> value;
  std::string shown;   // the value as a message quotes it ("got ...")
};
SettingValue json_setting(const nlohmann::json& v);

// One section's settings (model, optimizer or train) as a file gives them, set key by key through
// the field table: each by its key or its Megatron name (the flag without dashes, '-' as '_'), one
// setting named twice (key and Megatron name) refused. Messages start with the `where` given.
class SectionSettings {
 public:
  // Throws std::invalid_argument "<where>: unknown section ..." for a name other than the three.
  SectionSettings(RunConfig& cfg, const std::string& section, const std::string& where);
  // Throws std::invalid_argument "<where>: unknown key 'section.key'" (with the closest names),
  // "<where>: key 'section.key': expected ..., got ..." or the setting named twice.
  void set(const std::string& key, const SettingValue& value, const std::string& where);

 private:
  RunConfig& cfg_;
  std::string section_;
  std::map<std::string, std::string> given_;   // a field's key -> the name it was given under
};

// Registers one command-line flag per field on `app` (Megatron's names for the optimizer),
// writing into cfg when parsed.
void add_run_options(CLI::App& app, RunConfig& cfg);

// A field given for a resumed run whose value differs from the checkpoint's saved one.
struct ConfigChange {
  std::string section;   // "model" | "optimizer" | "train"
  std::string flag;      // e.g. "--hidden-size"
  std::string saved, now;
};
// Resuming without the flags a run was saved with (Megatron's --use-checkpoint-args): every field
// for which given(section, key, flag) is false takes its value from `saved` (a manifest's
// run_config; keys it lacks keep cfg's value). Returns the given fields that differ from `saved`.
// A saved value of the wrong type throws std::invalid_argument naming `where` and the key.
std::vector<ConfigChange> adopt_saved_config(
    RunConfig& cfg, const nlohmann::json& saved,
    const std::function<bool(const std::string& section, const std::string& key, const std::string& flag)>& given,
    const std::string& where);

// Human-readable multi-line dump, printed at the start of a run.
std::string describe(const RunConfig& cfg);

}   // namespace rh
