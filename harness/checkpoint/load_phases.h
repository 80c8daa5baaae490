// Internal to the checkpoint room: the three phases of load_checkpoint (load.cpp), each handing
// the next one a value, so that nothing in the model, optimizer or TrainState changes before the
// last refusal that can be made without touching them.
//   verify  (load.cpp)        the files, the manifest, and that the checkpoint is one of this run's
//                             (model tensors, optimizer params and groups, counters): VerifiedLoad;
//   plan    (load_plan.cpp)   for every state this rank restores, what the checkpoint holds and the
//                             conversion into what the optimizer holds (the conversion rules are
//                             there), refusing what cannot be restored: LoadPlan;
//   apply   (load_apply.cpp)  the plan carried out; a conversion that turns out inexact when the
//                             optimizer re-stores it refuses the load (without allow_lossy), and
//                             everything changed so far is put back.
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/manifest.h"

namespace rh::ckpt::detail {

// Phase 1's result: a checkpoint verified as a whole and against this run.
struct VerifiedLoad {
  Verified v;               // the manifest and every file it lists (sizes, XXH3-64, structure)
  ShardIndex ix;            // where each param's optimizer state lives, every element covered once
  std::string mpath;        // <dir>/manifest.json, for messages
  TrainState train_state;   // as saved: rank 0's generators
};

// One state's restore, as planned.
struct Action {
  std::string param, file, tkey;   // tkey: the tensor restored from, "<param>/exp_avg"
  optim::StateKey key;
  bool use_stored = true;
  optim::StoredState stored;   // use_stored: the owned part
  torch::Tensor value;         // !use_stored: the whole param's fp32 value for set_scaled_state
  torch::Tensor value_owned;   // its owned part (what the optimizer must then hold)
  torch::Tensor weight;        // remainder split on load: the whole bf16 weight belonging to it
};

// Phase 2's result.
struct LoadPlan {
  TrainState train_state;           // what the caller's TrainState becomes (this rank's generators)
  std::vector<Action> actions;      // by param in optimizer order, then master_param, exp_avg, exp_avg_sq
  std::vector<std::string> notes;   // LoadReport::conversions so far
};

// Phase 1 on the resolved checkpoint directory; throws CheckpointError.
// What a load of this model may decode at most (its parameters and buffers, 16 bytes of optimizer
// state per element, 64 KiB of scales per parameter): verify_for_load's decode budget.
uint64_t decode_budget(const torch::nn::Module& model);
VerifiedLoad verify_for_load(const std::string& dir, const torch::nn::Module& model, const optim::PrecisionAdam& opt,
                             const nlohmann::json& run_config);
// Phase 2, first: a dp_reshardable checkpoint's per-bucket sizes against this run's
// (load_layout.cpp); refuses a different bucket layout as upstream does. Throws CheckpointError.
void check_bucket_layout(const VerifiedLoad& checkpoint, const optim::PrecisionAdam& opt, const LoadOptions& opts,
                         std::vector<std::string>& notes);
// Phase 2; reads the optimizer, changes nothing. Throws CheckpointError.
LoadPlan plan_load(const VerifiedLoad& checkpoint, const optim::PrecisionAdam& opt, const LoadOptions& opts);
// Phase 3; appends to notes what it converted lossily (allow_lossy). On a refusal or any failure
// puts back what it changed and throws CheckpointError.
void apply_load(const VerifiedLoad& checkpoint, const LoadPlan& plan, torch::nn::Module& model,
                optim::PrecisionAdam& opt, const LoadOptions& opts, std::vector<std::string>& notes);

// "checkpoint file <dir>/<file> tensor '<key>'": how every phase names a tensor in a message.
std::string where(const Verified& v, const std::string& file, const std::string& key);

}   // namespace rh::ckpt::detail
