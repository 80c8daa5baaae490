// Precision-aware Adam/AdamW with TransformerEngine FusedAdam semantics (see
// shared/docs/BACKGROUND.md, "The optimizer being emulated"). It owns, per parameter, the master
// weight (fp32, fp16, or bf16 weight + int16 remainder), exp_avg and exp_avg_sq in their storage
// dtypes (fp16/fp8 with one fp32 scale per tensor), and the main gradient buffer.
// It knows nothing of models or checkpoints: it sees named tensors in parameter groups.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/optim/collectives.h"
#include "harness/optim/optimizer_config.h"
#include "harness/optim/shard_layout.h"
#include "harness/optim/stored_state.h"

namespace rh::optim {

struct ParamGroup {
  std::string name;                                            // e.g. "decay", "no_decay"
  std::vector<std::pair<std::string, torch::Tensor>> params;   // (name, model parameter)
  double weight_decay = 0.0;   // applied to this group's params by step(); OptimizerConfig's
                               // weight_decay is the value callers give their "decay" groups
};

class PrecisionAdam {
 public:
  // Validates cfg against the params' dtype (all params share one dtype). Master weights are
  // initialized from the params (remainders start at 0), moments at 0, step counters at 0.
  //
  // With a data-parallel group `comm` of size > 1 (it must outlive the optimizer) this is
  // Megatron's distributed optimizer (ZeRO stage 1): every rank holds the whole model and whole
  // main grads; the optimizer state is the rank's range of every bucket of Megatron's buffer
  // layout (ShardLayout), and step() updates only that, then all-gathers the params. A split
  // param's fp16/fp8 states are scaled per shard (each rank's own amax, as upstream) unless
  // cfg.shared_dp_scale. `model_order`: the param names in the model's order (Megatron's buffer
  // holds them reversed); empty = the groups' order.
  PrecisionAdam(std::vector<ParamGroup> groups, OptimizerConfig cfg, Collectives* comm = nullptr,
                const std::vector<std::string>& model_order = {});
  ~PrecisionAdam();
  PrecisionAdam(PrecisionAdam&&) noexcept;
  PrecisionAdam& operator=(PrecisionAdam&&) noexcept;
  PrecisionAdam(const PrecisionAdam&) = delete;   // owns per-param state buffers
  PrecisionAdam& operator=(const PrecisionAdam&) = delete;

  const OptimizerConfig& config() const;
  MasterMode master_mode() const;   // the mode in effect (reported, never silently changed)
  std::string describe() const;     // one line: mode, dtypes
  // Why store_param_remainders (default true, as upstream) has no effect in this configuration,
  // or "" when it has or is off; the tool prints it only when the user set the flag.
  std::string remainders_note() const;

  // --- gradients (main_grad buffers, in main_grads_dtype) ---
  void accumulate_grads();   // main_grad += param.grad for params with a grad; then
                             // param.grad is reset; marks the param as having a grad
  void zero_grads();         // main_grad = 0 and "has grad" cleared for every param
  // Marks every param as having a grad (its main grad, zero if nothing was accumulated): what
  // Megatron's distributed optimizer does, whose main grads live in a buffer every param has, so
  // TE's FusedAdam steps an expert that received no tokens with a zero gradient.
  void mark_all_grads();
  // Data parallel: Megatron's grad sync for the distributed optimizer. Each rank's main grads are
  // multiplied by fp32(1/dp) in place (gradient_scaling_factor, in the main grads' dtype), then
  // reduce-scattered with SUM in that dtype (bf16 main grads reduce in bf16, every add rounded),
  // in NCCL's ring order (precision_adam.cpp says which); the "has grad" marks are OR-ed. After
  // it, only the rank's shard of each param (shard_range) holds the reduced grad; the rest keeps
  // this rank's own scaled grads, as upstream's buffer does. A no-op for a group of one.
  void reduce_grads();
  // Global L2 norm as Megatron's get_grad_norm_fp32: the fp32 norm of this rank's shard,
  // squared, summed over the group, square root. It depends on the group size (at dp 1 it is
  // the sqrt of the fp32 sum of squares); every rank gets the same value. The shard's own sum
  // of squares is per-4096-element block sums added in a fixed order.
  double grad_norm() const;
  void scale_grads(float coef);   // main_grad *= coef on the rank's shard (clipping)
  int64_t count_zeros() const;    // zero elements of the shards' main grads, summed over the group
  const torch::Tensor& main_grad(const std::string& param) const;

  // --- the update ---
  // Advances every group's step counter (even for params without a grad, which are skipped),
  // updates the master and moments in fp32 with the FusedAdam op order, re-applies storage, and
  // writes the new model param (bf16 or fp32) in place. Main grads are left as they are (the
  // caller zero_grads() before the next accumulation).
  void step(double lr);

  // Data parallel: every rank receives the params of the ranges the others own (step() ends with
  // this; a restore that wrote only the owned parts calls it). A no-op for a group of one.
  void sync_params();

  // --- data-parallel layout ---
  const ShardLayout& layout() const;
  // The part [begin, end) of the param (flat, within the param) this rank holds state for.
  std::pair<int64_t, int64_t> shard_range(const std::string& param) const;

  // --- state access ---
  std::vector<std::string> param_names() const;   // deterministic: group order, then param order
  const torch::Tensor& param(const std::string& name) const;
  size_t num_groups() const;
  const std::string& group_name(size_t g) const;
  size_t group_of(const std::string& param) const;
  int64_t step_count(size_t g) const;
  // The weight decay step() applies to group g (a schedule sets it before each step, as
  // Megatron's OptimizerParamScheduler.step writes param_group['weight_decay']).
  double weight_decay(size_t g) const;
  void set_weight_decay(size_t g, double wd);
  void set_step_count(size_t g, int64_t step);

  // Upstream get_unscaled_state / set_scaled_state (transformer_engine/pytorch/optimizers/
  // fused_adam.py @d0067d0). fp32 values, except master_param in remainder mode: there both take
  // and return the raw int16 remainder and never touch the bf16 weight (upstream asserts the
  // dtype: int16 there, fp32 everywhere else; a wrong dtype throws std::invalid_argument saying
  // that upstream fails that assertion). set_scaled_state re-applies storage (_apply_scale):
  // fp16/fp8 scales recomputed from the value's amax (guarded if scale_zero_guard), bf16 RNE; an
  // fp16 master does not write the model param (upstream's set_scaled_state never does).
  // Values are of the owned part's shape; set_scaled_state also takes the whole param's value
  // (any rank can read it from a checkpoint) and stores the owned part, scaled by the owned
  // part's amax (upstream: the rank's FusedAdam holds only its shard), or by the whole tensor's
  // amax with shared_dp_scale.
  torch::Tensor get_unscaled_state(const std::string& param, StateKey key) const;
  void set_scaled_state(const std::string& param, StateKey key, const torch::Tensor& value);

  // The raw stored representation, for lossless checkpoints. In remainder mode master_param is
  // the int16 remainder (the bf16 half lives in the model param). set_stored checks dtype and
  // shape against what this optimizer holds and throws std::invalid_argument otherwise.
  // set_stored never writes the model param: a restore puts the model's bf16/fp32 weights back
  // bit for bit itself (in remainder mode they are the master's high half).
  const StoredState& stored(const std::string& param, StateKey key) const;
  void set_stored(const std::string& param, StateKey key, const StoredState& incoming);
  // set_stored without the copy: after the same checks, the optimizer holds incoming.data itself (made
  // contiguous if it is not), so a loader's verified staging tensor becomes the state. The
  // tensor it held before is released, never written.
  void adopt_stored(const std::string& param, StateKey key, StoredState incoming);
  // The checks set_stored makes (dtype, shape, scales present and consistent: a negative scale,
  // or an fp8 scale_inv other than the one this optimizer derives from `scale`, cannot come from
  // TE's formulas), without changing anything; throws std::invalid_argument.
  void check_stored(const std::string& param, StateKey key, const StoredState& incoming) const;

 private:
  struct Impl;   // per-param state, workspaces (precision_adam_impl.h)
  std::unique_ptr<Impl> impl_;
};

}   // namespace rh::optim
