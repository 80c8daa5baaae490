// Deliberate faults the resume check must catch, each one omitting or breaking one piece of
// restore. One table says, per fault, its name, what it breaks and where it acts on a load: a
// state key the load leaves alone, the generators left fresh, or a change to the restored state.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "harness/checkpoint/train_state.h"

namespace rh {

struct RunConfig;
class Trainer;

enum class Fault {
  none,
  skip_rng_restore,
  skip_data_position_restore,
  reset_step_counter,
  skip_exp_avg_restore,
  reset_lr_schedule,
  drop_remainders,
  reset_wd_schedule,
  wrong_lr_decay_style,
  skip_expert_bias_restore,
};

struct FaultSpec {
  Fault fault;
  const char* name;
  const char* what;                 // what it breaks (one line)
  const char* skip_key = nullptr;   // a state key the load does not restore (LoadOptions::skip_keys)
  bool fresh_rng = false;           // the generators keep their fresh state
  // Acts on the restored training state before the trainer takes it (null: nothing).
  void (*on_state)(const RunConfig& cfg, Trainer& tr, ckpt::TrainState& st) = nullptr;
};

// Every fault, none first, in the order of the enum.
const std::vector<FaultSpec>& fault_specs();
const FaultSpec& spec_of(Fault f);
std::string to_string(Fault f);
Fault parse_fault(const std::string& name);   // throws std::invalid_argument listing the names
const std::vector<std::string>& fault_names();

// The state keys a load with fault f skips (LoadOptions::skip_keys).
std::set<std::string> fault_skip_keys(Fault f);
// f's change to the restored state (the faults that act after the load).
void inject_state_fault(Fault f, const RunConfig& cfg, Trainer& trainer, ckpt::TrainState& train_state);

}   // namespace rh
