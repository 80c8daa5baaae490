// Everything besides tensors that a resumed run needs to continue exactly: the iteration, the
// data position, the optimizer-param scheduler's state, and every random-number generator's state.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rh::ckpt {

// Megatron's OptimizerParamScheduler.state_dict() (megatron/core/optimizer_param_scheduler.py,
// state_dict): the same ten keys and values. Steps count samples, as Megatron's
// get_optimizer_param_scheduler (megatron/training/training.py) sizes them: iterations x
// global batch, and the scheduler advances by the global batch after each optimizer step.
struct OptParamSchedulerState {
  double max_lr = 0.0;
  int64_t lr_warmup_steps = 0;   // samples
  int64_t num_steps = 0;         // samples consumed by the steps taken so far
  std::string lr_decay_style = "cosine";   // constant | linear | cosine | inverse-square-root | WSD
  int64_t lr_decay_steps = 0;    // samples, fixed by config, not by where a run stops
  double min_lr = 0.0;
  double start_wd = 0.0;
  double end_wd = 0.0;
  std::string wd_incr_style = "constant";   // constant | linear | cosine
  int64_t wd_incr_steps = 0;     // samples (train.iterations x global batch)
};

struct TrainState {
  int64_t iteration = 0;          // completed iterations
  int64_t consumed_samples = 0;   // data position: index of the next sample to read
  OptParamSchedulerState opt_param_scheduler;
  std::map<std::string, std::vector<uint8_t>> rng_states;  // generator name -> get_state() bytes
};

}  // namespace rh::ckpt
