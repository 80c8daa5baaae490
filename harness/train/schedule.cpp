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
  const auto& t = cfg.train;
  const int64_t gb = t.global_batch;
  ckpt::OptParamSchedulerState s;
  s.max_lr = t.lr;
  s.min_lr = t.min_lr;
  // training.py get_optimizer_param_scheduler: lr_warmup_iters * global_batch_size, ...
  s.lr_warmup_steps = t.lr_warmup_iters * gb;
  s.lr_decay_steps = t.lr_decay_iters * gb;
  s.lr_decay_style = t.lr_decay_style;
  // arguments.py: --start-weight-decay / --end-weight-decay default to --weight-decay.
  s.start_wd = t.start_weight_decay < 0 ? cfg.optim.weight_decay : t.start_weight_decay;
  s.end_wd = t.end_weight_decay < 0 ? cfg.optim.weight_decay : t.end_weight_decay;
  s.wd_incr_style = t.weight_decay_incr_style;
  s.wd_incr_steps = t.iterations * gb;   // train_iters * global_batch_size
  s.num_steps = 0;
  return s;
}

SchedulerArgs scheduler_args_from_config(const RunConfig& cfg) {
  const auto& t = cfg.train;
  SchedulerArgs a;
  a.init_lr = t.lr_warmup_init;
  a.wsd_decay_steps = t.lr_wsd_decay_iters < 0 ? -1 : t.lr_wsd_decay_iters * t.global_batch;
  a.lr_wsd_decay_style = t.lr_wsd_decay_style;
  a.override_opt_param_scheduler = t.override_opt_param_scheduler;
  a.use_checkpoint_opt_param_scheduler = t.use_checkpoint_opt_param_scheduler;
  return a;
}

// optimizer_param_scheduler.py OptimizerParamScheduler.get_lr
double scheduler_lr(const ckpt::OptParamSchedulerState& s, const SchedulerArgs& a) {
  const double max_lr = s.max_lr, min_lr = s.min_lr;
  // "Use linear warmup for the initial part": num_steps <= warmup (inclusive), from init_lr.
  if (s.lr_warmup_steps > 0 && s.num_steps <= s.lr_warmup_steps)
    return a.init_lr +
           ((max_lr - a.init_lr) * static_cast<double>(s.num_steps) / static_cast<double>(s.lr_warmup_steps));
  if (s.lr_decay_style == "constant") return max_lr;
  if (s.num_steps > s.lr_decay_steps) return min_lr;
  if (s.lr_decay_style == "inverse-square-root") {
    const double warmup_steps = static_cast<double>(std::max<int64_t>(s.lr_warmup_steps, 1));
    const double num_steps = static_cast<double>(std::max<int64_t>(s.num_steps, 1));
    const double lr = max_lr * std::pow(warmup_steps, 0.5) / std::pow(num_steps, 0.5);
    return std::max(min_lr, lr);
  }
  const int64_t num_steps_ = s.num_steps - s.lr_warmup_steps;
  const int64_t decay_steps_ = s.lr_decay_steps - s.lr_warmup_steps;
  const double decay_ratio = static_cast<double>(num_steps_) / static_cast<double>(decay_steps_);
  if (!(decay_ratio >= 0.0 && decay_ratio <= 1.0))
    throw std::logic_error("scheduler: decay ratio " + std::to_string(decay_ratio) + " outside [0, 1]");
  const double delta_lr = max_lr - min_lr;
  double coeff = 0.0;
  if (s.lr_decay_style == "linear") {
    coeff = 1.0 - decay_ratio;
  } else if (s.lr_decay_style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * decay_ratio) + 1.0);
  } else if (s.lr_decay_style == "WSD") {
    if (a.wsd_decay_steps < 0) throw std::invalid_argument("lr_decay_style WSD needs train.lr_wsd_decay_iters");
    const int64_t wsd_anneal_start_ = s.lr_decay_steps - a.wsd_decay_steps;
    if (s.num_steps <= wsd_anneal_start_) {
      coeff = 1.0;
    } else {
      const int64_t wsd_steps = s.num_steps - wsd_anneal_start_;
      const double r = static_cast<double>(wsd_steps) / static_cast<double>(a.wsd_decay_steps);
      if (a.lr_wsd_decay_style == "linear") coeff = 1.0 - r;
      else if (a.lr_wsd_decay_style == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (a.lr_wsd_decay_style == "exponential") coeff = (2.0 * std::pow(0.5, r)) - 1.0;
      else if (a.lr_wsd_decay_style == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
      else throw std::invalid_argument("unknown lr_wsd_decay_style '" + a.lr_wsd_decay_style + "'");
    }
  } else {
    throw std::invalid_argument(s.lr_decay_style + " decay style is not supported.");
  }
  return min_lr + coeff * delta_lr;
}

// optimizer_param_scheduler.py OptimizerParamScheduler.get_wd
double scheduler_wd(const ckpt::OptParamSchedulerState& s) {
  if (s.num_steps > s.wd_incr_steps) return s.end_wd;
  if (s.wd_incr_style == "constant") {
    if (s.start_wd != s.end_wd)
      throw std::invalid_argument("weight_decay_incr_style constant needs start_wd == end_wd");
    return s.end_wd;
  }
  const double incr_ratio = static_cast<double>(s.num_steps) / static_cast<double>(s.wd_incr_steps);
  const double delta_wd = s.end_wd - s.start_wd;
  double coeff = 0.0;
  if (s.wd_incr_style == "linear") coeff = incr_ratio;
  else if (s.wd_incr_style == "cosine") coeff = 0.5 * (std::cos(M_PI * (1 - incr_ratio)) + 1.0);
  else throw std::invalid_argument(s.wd_incr_style + " weight decay increment style is not supported.");
  return s.start_wd + coeff * delta_wd;
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
                                                  const ckpt::OptParamSchedulerState& sd, const SchedulerArgs& a,
                                                  const std::string& where) {
  // __init__: assert not (override and use_checkpoint), 'both override and use-checkpoint are set.'
  if (a.override_opt_param_scheduler && a.use_checkpoint_opt_param_scheduler)
    throw std::invalid_argument(
        "train.override_opt_param_scheduler and train.use_checkpoint_opt_param_scheduler: "
        "both override and use-checkpoint are set.");
  // _check_and_set on every compared key, in load_state_dict's order.
  std::vector<const ckpt::SchedulerField*> compared;
  for (const auto& f : ckpt::scheduler_fields())
    if (f.load_order >= 0) compared.push_back(&f);
  std::sort(compared.begin(), compared.end(),
            [](const ckpt::SchedulerField* x, const ckpt::SchedulerField* y) { return x->load_order < y->load_order; });
  ckpt::OptParamSchedulerState s = cls;
  for (const ckpt::SchedulerField* f : compared)
    std::visit(
        [&](auto m) {
          const auto& cls_value = cls.*m;
          const auto& sd_value = sd.*m;
          if (a.override_opt_param_scheduler) return;   // the class value
          if (!a.use_checkpoint_opt_param_scheduler && !(cls_value == sd_value))
            throw std::invalid_argument(where + ": opt_param_scheduler." + f->key +
                                        ": OptimizerParamScheduler: class input value " + show(cls_value) +
                                        " and checkpoint value " + show(sd_value) + " for " + f->name +
                                        " do not match (resume with --use-checkpoint-opt_param-scheduler to take the "
                                        "checkpoint's, or --override-opt_param-scheduler to take this run's)");
          s.*m = sd_value;
        },
        f->member);
  s.num_steps = cls.num_steps + sd.num_steps;   // self.step(increment=num_steps)
  return s;
}

}   // namespace rh
