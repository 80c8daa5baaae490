// Everything besides tensors that a resumed run needs to continue exactly: the iteration, the
// data position, the optimizer-param scheduler's state, and every random-number generator's state.
// LibTorch-free (the manifest reader and its fuzz target use it): the scheduler's field table and
// the JSON form of a train state, parsed once through the checked accessor.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace rh::ckpt {

// Megatron's OptimizerParamScheduler.state_dict() (megatron/core/optimizer_param_scheduler.py,
// state_dict): the same ten keys and values. Steps count samples, as Megatron's
// get_optimizer_param_scheduler (megatron/training/training.py) sizes them: iterations x
// global batch, and the scheduler advances by the global batch after each optimizer step.
struct OptParamSchedulerState {
  double max_lr = 0.0;
  int64_t lr_warmup_steps = 0;             // samples
  int64_t num_steps = 0;                   // samples consumed by the steps taken so far
  std::string lr_decay_style = "cosine";   // constant | linear | cosine | inverse-square-root | WSD
  int64_t lr_decay_steps = 0;              // samples, fixed by config, not by where a run stops
  double min_lr = 0.0;
  double start_wd = 0.0;
  double end_wd = 0.0;
  std::string wd_incr_style = "constant";   // constant | linear | cosine
  int64_t wd_incr_steps = 0;                // samples (train.iterations x global batch)
};

// The scheduler's keys, one row each: written into the manifest, read back (type and range
// checked), compared on load (OptimizerParamScheduler.load_state_dict's _check_and_set) and
// fingerprinted. In state_dict's order.
struct SchedulerField {
  const char* key;    // the state_dict key
  const char* name;   // the name _check_and_set gives it in its message; null: num_steps, which
                      // load_state_dict adds (step(increment=num_steps)) instead of comparing
  int load_order;     // position among the compared keys in load_state_dict (-1: num_steps)
  std::variant<double OptParamSchedulerState::*, int64_t OptParamSchedulerState::*,
               std::string OptParamSchedulerState::*>
      member;
};
const std::vector<SchedulerField>& scheduler_fields();

struct TrainState {
  int64_t iteration = 0;          // completed iterations
  int64_t consumed_samples = 0;   // data position: index of the next sample to read
  OptParamSchedulerState opt_param_scheduler;
  std::map<std::string, std::vector<uint8_t>> rng_states;   // generator name -> get_state() bytes
};

// One data-parallel rank's generators, as a manifest's rank_states lists them.
struct RankGenerators {
  int64_t dp_rank = 0;
  std::map<std::string, std::vector<uint8_t>> rng_states;
};

class JsonField;

// {"max_lr": ..., ...}: every scheduler key, as Megatron's state_dict holds it.
nlohmann::json to_json(const OptParamSchedulerState& s);
// {"iteration", "consumed_samples", "opt_param_scheduler", "rng_states" (hex)}.
nlohmann::json to_json(const TrainState& s);
nlohmann::json rng_states_json(const std::map<std::string, std::vector<uint8_t>>& rng);

// The parsers of those forms: every field's type and range checked as it is read (counters in
// [0, max_counter]), throwing CheckpointError "<file>: field /json/path: expected ..., got ...".
OptParamSchedulerState parse_scheduler_state(const JsonField& j, int64_t max_counter);
// `iteration`: the manifest's /iteration, which the train state's must equal.
TrainState parse_train_state(const JsonField& j, int64_t iteration, int64_t max_counter);
// Generator name -> hex digits of even length.
std::map<std::string, std::vector<uint8_t>> parse_rng_states(const JsonField& j);
// Hex digits (of even length; exact_len of them, if not 0) as bytes.
std::vector<uint8_t> parse_hex(const JsonField& f, size_t exact_len = 0);

}   // namespace rh::ckpt
