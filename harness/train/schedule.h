// Megatron's OptimizerParamScheduler: learning-rate warmup and decay, weight-decay increment, its
// checkpointed state_dict and the load-time rules of --override-opt_param-scheduler and
// --use-checkpoint-opt_param-scheduler. Rules from megatron/core/optimizer_param_scheduler.py
// (OptimizerParamScheduler.get_lr, get_wd, step, state_dict, _check_and_set, load_state_dict) and
// the sizing in megatron/training/training.py (get_optimizer_param_scheduler). It knows nothing of
// a model or of the optimizer's internals: the trainer applies the values it returns.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/checkpoint/train_state.h"

namespace rh {

struct RunConfig;   // config.h, which validates with the style lists below: declared, not included

// The scheduler's class values that upstream's state_dict does not hold (they always come from
// the arguments of the run, never from the checkpoint), and the two load-time switches.
struct SchedulerArgs {
  double init_lr = 0.0;           // --lr-warmup-init
  int64_t wsd_decay_steps = -1;   // samples; -1: None (only WSD needs it)
  std::string lr_wsd_decay_style = "exponential";
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
};

const std::vector<std::string>& lr_decay_styles();       // constant linear cosine inverse-square-root WSD
const std::vector<std::string>& lr_wsd_decay_styles();   // exponential linear cosine minus_sqrt
const std::vector<std::string>& wd_incr_styles();        // constant linear cosine

// training.py get_optimizer_param_scheduler: steps = iterations x global batch; wd_incr_steps =
// train_iters x global batch; start/end weight decay default to --weight-decay (arguments.py).
// num_steps 0 (the constructor's step(0)).
ckpt::OptParamSchedulerState scheduler_from_config(const RunConfig& cfg);
SchedulerArgs scheduler_args_from_config(const RunConfig& cfg);

// The learning rate and weight decay the scheduler sets at its current num_steps
// (OptimizerParamScheduler.get_lr / get_wd with a param group carrying no overrides).
double scheduler_lr(const ckpt::OptParamSchedulerState& scheduler, const SchedulerArgs& args);
double scheduler_wd(const ckpt::OptParamSchedulerState& scheduler);

// OptimizerParamScheduler.load_state_dict on a scheduler built from `cls` (num_steps 0): each
// value through _check_and_set (override: the class value; use-checkpoint: the checkpoint's;
// neither: they must be equal, else std::invalid_argument with upstream's message naming the
// key), then step(num_steps). `where` names the checkpoint in the message.
ckpt::OptParamSchedulerState load_scheduler_state(const ckpt::OptParamSchedulerState& cls,
                                                  const ckpt::OptParamSchedulerState& sd, const SchedulerArgs& args,
                                                  const std::string& where);

}   // namespace rh
