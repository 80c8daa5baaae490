// Internal to the optimizer room: what PrecisionAdam holds (its Impl: config, per-parameter
// state, step counters, layout), shared by precision_adam.cpp (construction, gradients, the step)
// and precision_adam_state.cpp (the state exchanged with checkpoints).
#pragma once
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/optim/adam_step.h"
#include "harness/optim/precision_adam.h"
#include "harness/optim/storage_codecs.h"

namespace rh::optim {

struct PrecisionAdam::Impl {
  OptimizerConfig cfg;
  MasterMode mode = MasterMode::fp32;
  torch::ScalarType param_dtype = torch::kFloat;
  std::vector<std::string> group_names;
  std::vector<double> group_wd;
  std::vector<int64_t> steps;
  std::vector<detail::ParamState> params;   // group order, then param order
  std::unordered_map<std::string, size_t> index;
  detail::Workspace ws;
  Collectives* comm = nullptr;   // null: a group of one
  ShardLayout layout;
  std::vector<size_t> split;     // params split across ranks
  std::vector<int> split_slot;   // param index -> slot in `split`, or -1

  int dp_size() const { return layout.size; }

  detail::ParamState& at(const std::string& name) {
    auto it = index.find(name);
    if (it == index.end()) throw std::invalid_argument("PrecisionAdam: unknown param '" + name + "'");
    return params[it->second];
  }
  const detail::ParamState& at(const std::string& name) const { return const_cast<Impl*>(this)->at(name); }
  static StoredState& state(detail::ParamState& param_state, StateKey key) {
    return key == StateKey::master_param ? param_state.master
           : key == StateKey::exp_avg    ? param_state.exp_avg
                                         : param_state.exp_avg_sq;
  }
  static const StoredState& state(const detail::ParamState& param_state, StateKey key) {
    return state(const_cast<detail::ParamState&>(param_state), key);
  }
  void check_group(size_t g) const {
    if (g >= steps.size())
      throw std::out_of_range("PrecisionAdam: group " + std::to_string(g) + " out of range (" +
                              std::to_string(steps.size()) + " groups)");
  }
};

namespace detail {

// Stores the owned part [begin, end) of the fp32 value `full` (the whole param) with TE's
// scaling (_apply_scale): the amax of the owned part (per shard, upstream), or of the whole
// tensor (`shared`).
inline void store_value_scaled(StoredState& state, const torch::Tensor& full, int64_t begin, int64_t end, bool guard,
                               bool shared, Workspace& ws) {
  const torch::Tensor x = full.to(torch::kFloat).contiguous().view({-1});
  const torch::Tensor part = x.narrow(0, begin, end - begin);
  store_scaled(state, part, codec::abs_max(shared ? x : part), guard, ws);
}

// The part of `p` a rank owns: p itself when whole, else a 1-D view of [begin, end).
inline torch::Tensor owned_part(const torch::Tensor& p, int64_t begin, int64_t end) {
  if (begin == 0 && end == p.numel()) return p;
  return p.view({-1}).narrow(0, begin, end - begin);
}
inline torch::Tensor owned_part(const ParamState& param_state, const torch::Tensor& full) {
  return owned_part(full, param_state.begin, param_state.end);
}

}   // namespace detail
}   // namespace rh::optim
