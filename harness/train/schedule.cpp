// The optimizer-param scheduler; see schedule.h. Every formula keeps upstream's operation order
// (Python floats are doubles; math.cos / math.pow / math.sqrt / ** are libm's cos, pow, sqrt).
#include "harness/train/schedule.h"

#include "harness/train/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace rh {

const std::vector<std::string>& lr_decay_styles() {
  static const std::vector<std::string> v = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  return v;
}
const std::vector<std::string>& lr_wsd_decay_styles() {
  static const std::vector<std::string> v = {"exponential", "linear", "cosine", "minus_sqrt"};
  return v;
}
const std::vector<std::string>& wd_incr_styles() {
  static const std::vector<std::string> v = {"constant", "linear", "cosine"};
  return v;
}

ckpt::OptParamSchedulerState scheduler_from_config(const RunConfig& cfg) {
  const auto& train = cfg.train;
  const int64_t global_batch = train.global_batch;
  ckpt::OptParamSchedulerState scheduler;
  scheduler.max_lr = train.lr;
  scheduler.min_lr = train.min_lr;
  // training.py get_optimizer_param_scheduler: lr_warmup_iters * global_batch_size, ...
  scheduler.lr_warmup_steps = train.lr_warmup_iters * global_batch;
  scheduler.lr_decay_steps = train.lr_decay_iters * global_batch;
  scheduler.lr_decay_style = train.lr_decay_style;
  // arguments.py: --start-weight-decay / --end-weight-decay default to --weight-decay.
  scheduler.start_wd = train.start_weight_decay < 0 ? cfg.optim.weight_decay : train.start_weight_decay;
  scheduler.end_wd = train.end_weight_decay < 0 ? cfg.optim.weight_decay : train.end_weight_decay;
  scheduler.wd_incr_style = train.weight_decay_incr_style;
  scheduler.wd_incr_steps = train.iterations * global_batch;   // train_iters * global_batch_size
  scheduler.num_steps = 0;
  return scheduler;
}

SchedulerArgs scheduler_args_from_config(const RunConfig& cfg) {
  const auto& train = cfg.train;
  SchedulerArgs args;
  args.init_lr = train.lr_warmup_init;
  args.wsd_decay_steps = train.lr_wsd_decay_iters < 0 ? -1 : train.lr_wsd_decay_iters * train.global_batch;
  args.lr_wsd_decay_style = train.lr_wsd_decay_style;
  args.override_opt_param_scheduler = train.override_opt_param_scheduler;
  args.use_checkpoint_opt_param_scheduler = train.use_checkpoint_opt_param_scheduler;
  return args;
}

// optimizer_param_scheduler.py OptimizerParamScheduler.get_lr
double scheduler_lr(const ckpt::OptParamSchedulerState& scheduler, const SchedulerArgs& args) {
  const double max_lr = scheduler.max_lr, min_lr = scheduler.min_lr;
  // "Use linear warmup for the initial part": num_steps <= warmup (inclusive), from init_lr.
  if (scheduler.lr_warmup_steps > 0 && scheduler.num_steps <= scheduler.lr_warmup_steps)
    return args.init_lr + ((max_lr - args.init_lr) * static_cast<double>(scheduler.num_steps) /
                           static_cast<double>(scheduler.lr_warmup_steps));
  if (scheduler.lr_decay_style == "constant") return max_lr;
  if (scheduler.num_steps > scheduler.lr_decay_steps) return min_lr;
  if (scheduler.lr_decay_style == "inverse-square-root") {
    const double warmup_steps = static_cast<double>(std::max<int64_t>(scheduler.lr_warmup_steps, 1));
    const double num_steps = static_cast<double>(std::max<int64_t>(scheduler.num_steps, 1));
    const double lr = max_lr * std::pow(warmup_steps, 0.5) / std::pow(num_steps, 0.5);
    return std::max(min_lr, lr);
  }
  const int64_t num_steps_ = scheduler.num_steps - scheduler.lr_warmup_steps;
  const int64_t decay_steps_ = scheduler.lr_decay_steps - scheduler.lr_warmup_steps;
  const double decay_ratio = static_cast<double>(num_steps_) / static_cast<double>(decay_steps_);
  if (!(decay_ratio >= 0.0 && decay_ratio <= 1.0))
    throw std::logic_error("scheduler: decay ratio " + std::to_string(decay_ratio) + " outside [0, 1]");
  const double delta_lr = max_lr - min_lr;
  double coeff = 0.0;
  if (scheduler.lr_decay_style == "linear") {
    coeff = 1.0 - decay_ratio;
  } else if (scheduler.lr_decay_style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * decay_ratio) + 1.0);
  } else if (scheduler.lr_decay_style == "WSD") {
    if (args.wsd_decay_steps < 0) throw std::invalid_argument("lr_decay_style WSD needs train.lr_wsd_decay_iters");
    const int64_t wsd_anneal_start_ = scheduler.lr_decay_steps - args.wsd_decay_steps;
    if (scheduler.num_steps <= wsd_anneal_start_) {
      coeff = 1.0;
    } else {
      const int64_t wsd_steps = scheduler.num_steps - wsd_anneal_start_;
      const double wsd_decay_ratio = static_cast<double>(wsd_steps) / static_cast<double>(args.wsd_decay_steps);
      if (args.lr_wsd_decay_style == "linear") coeff = 1.0 - wsd_decay_ratio;
      else if (args.lr_wsd_decay_style == "cosine") coeff = 0.5 * (std::cos(M_PI * wsd_decay_ratio) + 1.0);
      else if (args.lr_wsd_decay_style == "exponential") coeff = (2.0 * std::pow(0.5, wsd_decay_ratio)) - 1.0;
      else if (args.lr_wsd_decay_style == "minus_sqrt") coeff = 1.0 - std::sqrt(wsd_decay_ratio);
      else throw std::invalid_argument("unknown lr_wsd_decay_style '" + args.lr_wsd_decay_style + "'");
    }
  } else {
    throw std::invalid_argument(scheduler.lr_decay_style + " decay style is not supported.");
  }
  return min_lr + coeff * delta_lr;
}

// optimizer_param_scheduler.py OptimizerParamScheduler.get_wd
double scheduler_wd(const ckpt::OptParamSchedulerState& scheduler) {
  if (scheduler.num_steps > scheduler.wd_incr_steps) return scheduler.end_wd;
  if (scheduler.wd_incr_style == "constant") {
    if (scheduler.start_wd != scheduler.end_wd)
      throw std::invalid_argument("weight_decay_incr_style constant needs start_wd == end_wd");
    return scheduler.end_wd;
  }
  const double incr_ratio = static_cast<double>(scheduler.num_steps) / static_cast<double>(scheduler.wd_incr_steps);
  const double delta_wd = scheduler.end_wd - scheduler.start_wd;
  double coeff = 0.0;
  if (scheduler.wd_incr_style == "linear") coeff = incr_ratio;
  else if (scheduler.wd_incr_style == "cosine") coeff = 0.5 * (std::cos(M_PI * (1 - incr_ratio)) + 1.0);
  else throw std::invalid_argument(scheduler.wd_incr_style + " weight decay increment style is not supported.");
  return scheduler.start_wd + coeff * delta_wd;
}

namespace {

std::string show(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}
std::string show(int64_t v) { return std::to_string(v); }
std::string show(const std::string& v) { return v; }

}   // namespace

// optimizer_param_scheduler.py _check_and_set + load_state_dict (the current key names; the
// legacy aliases start_lr, warmup_iter, end_iter, decay_style, num_iters never occur here).
ckpt::OptParamSchedulerState load_scheduler_state(const ckpt::OptParamSchedulerState& cls,
                                                  const ckpt::OptParamSchedulerState& sd, const SchedulerArgs& args,
                                                  const std::string& where) {
  // __init__: assert not (override and use_checkpoint), 'both override and use-checkpoint are set.'
  if (args.override_opt_param_scheduler && args.use_checkpoint_opt_param_scheduler)
    throw std::invalid_argument(
        "train.override_opt_param_scheduler and train.use_checkpoint_opt_param_scheduler: "
        "both override and use-checkpoint are set.");
  // _check_and_set on every compared key, in load_state_dict's order.
  std::vector<const ckpt::SchedulerField*> compared;
  for (const auto& field : ckpt::scheduler_fields())
    if (field.load_order >= 0) compared.push_back(&field);
  std::sort(compared.begin(), compared.end(),
            [](const ckpt::SchedulerField* x, const ckpt::SchedulerField* y) { return x->load_order < y->load_order; });
  ckpt::OptParamSchedulerState loaded = cls;
  for (const ckpt::SchedulerField* field : compared)
    std::visit(
        [&](auto member) {
          const auto& cls_value = cls.*member;
          const auto& sd_value = sd.*member;
          if (args.override_opt_param_scheduler) return;   // the class value
          if (!args.use_checkpoint_opt_param_scheduler && !(cls_value == sd_value))
            throw std::invalid_argument(where + ": opt_param_scheduler." + field->key +
                                        ": OptimizerParamScheduler: class input value " + show(cls_value) +
                                        " and checkpoint value " + show(sd_value) + " for " + field->name +
                                        " do not match (resume with --use-checkpoint-opt_param-scheduler to take the "
                                        "checkpoint's, or --override-opt_param-scheduler to take this run's)");
          loaded.*member = sd_value;
        },
        field->member);
  loaded.num_steps = cls.num_steps + sd.num_steps;   // self.step(increment=num_steps)
  return loaded;
}

}   // namespace rh
