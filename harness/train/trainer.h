// The deterministic trainer: synthetic data, micro-batches with gradient accumulation into the
// optimizer's main-grad buffers, global-norm clipping in fp32, Megatron's optimizer-param scheduler
// (schedule.h: LR warmup and decay, weight-decay increment, lengths fixed by config), and the
// precision-aware Adam. It trains any models::CausalLM
// through its loss() and named parameters; it knows nothing of a particular model's layers.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/train_state.h"
#include "harness/train/config.h"
#include "harness/train/data.h"
#include "harness/train/metrics.h"
#include "harness/optim/precision_adam.h"
#include "harness/train/schedule.h"
#include "models/model.h"

namespace rh {

class Trainer {
 public:
  // With a data-parallel group (size > 1; it must outlive the trainer) the optimizer is the
  // distributed one, and rank r runs micro-batches [r * n / size, (r + 1) * n / size) of the n
  // of each iteration: the samples of an iteration do not depend on the group size.
  explicit Trainer(const RunConfig& cfg, optim::Collectives* group = nullptr);

  IterMetrics train_iteration();   // one iteration; advances the state

  const RunConfig& config() const { return cfg_; }
  models::CausalLM& model() { return *model_; }
  const models::CausalLM& model() const { return *model_; }
  optim::PrecisionAdam& optimizer() { return *optimizer_; }
  const optim::PrecisionAdam& optimizer() const { return *optimizer_; }
  int64_t iteration() const { return state_.iteration; }

  // A snapshot of the training state with the current RNG states filled in.
  ckpt::TrainState state() const;
  // Installs a loaded state. restore_rng=false keeps the generators as they are (a fault).
  void set_state(const ckpt::TrainState& train_state, bool restore_rng = true);

  // XXH3-64 of every model parameter and every optimizer-state tensor (and scale), keyed like
  // the checkpoint: "model/<param>", "<param>/exp_avg", "<param>/exp_avg.scale", ... (this
  // rank's part of the optimizer state when data parallel)
  std::vector<std::pair<std::string, uint64_t>> fingerprints() const;

 private:
  RunConfig cfg_;
  optim::Collectives* group_ = nullptr;
  int rank_ = 0, dp_size_ = 1;
  torch::Device device_;
  std::shared_ptr<models::CausalLM> model_;
  std::unique_ptr<optim::PrecisionAdam> optimizer_;
  SyntheticCorpus corpus_;
  torch::Generator dropout_gen_;
  void update_expert_bias();   // after the micro-batches of an iteration (see trainer.cpp)
  SchedulerArgs sched_args_;
  ckpt::TrainState state_;
};

// Megatron's get_updated_expert_bias (moe_utils.py) on (L, E) fp32 counts already all-reduced:
// bias + sign(sum(tokens) / E - tokens) * rate, in fp32.
torch::Tensor updated_expert_bias(const torch::Tensor& tokens_per_expert, const torch::Tensor& expert_bias,
                                  double rate);

// XXH3-64 over a tensor's bytes (made contiguous, on CPU).
uint64_t tensor_xxh3(const torch::Tensor& t);

}   // namespace rh
