// PrecisionAdam: owns the per-parameter optimizer state, the main-grad buffers and the step
// counters; the update itself is adam_step.cpp, the storage formats storage_codecs.cpp.
#include "harness/optim/precision_adam.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "harness/optim/adam_step.h"
#include "harness/optim/storage_codecs.h"

namespace rh::optim {

using detail::ParamState;

struct PrecisionAdam::Impl {
  OptimizerConfig cfg;
  MasterMode mode = MasterMode::fp32;
  torch::ScalarType param_dtype = torch::kFloat;
  std::vector<std::string> group_names;
  std::vector<double> group_wd;
  std::vector<int64_t> steps;
  std::vector<ParamState> params;                 // group order, then param order
  std::unordered_map<std::string, size_t> index;
  detail::Workspace ws;

  ParamState& at(const std::string& name) {
    auto it = index.find(name);
    if (it == index.end())
      throw std::invalid_argument("PrecisionAdam: unknown param '" + name + "'");
    return params[it->second];
  }
  StoredState& state(ParamState& ps, StateKey key) {
    return key == StateKey::master_param ? ps.master
           : key == StateKey::exp_avg    ? ps.exp_avg
                                         : ps.exp_avg_sq;
  }
  void check_group(size_t g) const {
    if (g >= steps.size())
      throw std::out_of_range("PrecisionAdam: group " + std::to_string(g) + " out of range (" +
                              std::to_string(steps.size()) + " groups)");
  }
};

namespace {

StoredState zeros_state(const torch::Tensor& like, Dtype d) {
  StoredState s;
  s.dtype = d;
  s.data = torch::zeros(like.sizes(), storage_scalar_type(d));
  if (d == Dtype::fp16 || d == Dtype::fp8) s.scale = 1.0f;   // all-zero tensor: see codec
  return s;
}

// fp16/fp8 *moments* carry a scale; an fp16 master does not.
bool scaled_moment(StateKey key, Dtype d) {
  return key != StateKey::master_param && (d == Dtype::fp16 || d == Dtype::fp8);
}

std::string where(const std::string& param, StateKey key) {
  return "param '" + param + "' state '" + key_name(key) + "'";
}

}  // namespace

PrecisionAdam::PrecisionAdam(std::vector<ParamGroup> groups, OptimizerConfig cfg)
    : impl_(std::make_unique<Impl>()) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  I.cfg = cfg;
  bool have_dtype = false;
  for (const auto& g : groups)
    for (const auto& [name, p] : g.params) {
      if (!p.defined()) throw std::invalid_argument("PrecisionAdam: param '" + name + "' is undefined");
      if (!have_dtype) I.param_dtype = p.scalar_type(), have_dtype = true;
      if (p.scalar_type() != I.param_dtype)
        throw std::invalid_argument("PrecisionAdam: param '" + name + "' is " +
                                    c10::toString(p.scalar_type()) + " but earlier params are " +
                                    c10::toString(I.param_dtype) + "; all params share one dtype");
      if (!p.device().is_cpu() || !p.is_contiguous())
        throw std::invalid_argument("PrecisionAdam: param '" + name +
                                    "' must be a contiguous CPU tensor (its state is updated "
                                    "through flat views)");
    }
  validate(cfg, I.param_dtype);
  I.mode = effective_master_mode(cfg, I.param_dtype);
  const Dtype master_dtype = I.mode == MasterMode::fp32   ? Dtype::fp32
                             : I.mode == MasterMode::fp16 ? Dtype::fp16
                                                          : Dtype::int16;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    I.group_names.push_back(groups[gi].name);
    I.group_wd.push_back(groups[gi].weight_decay);
    I.steps.push_back(0);
    for (auto& [name, p] : groups[gi].params) {
      if (I.index.count(name))
        throw std::invalid_argument("PrecisionAdam: param '" + name + "' appears twice");
      ParamState ps;
      ps.name = name;
      ps.group = gi;
      ps.param = p;
      ps.master.dtype = master_dtype;
      if (I.mode == MasterMode::remainders) {
        ps.master.data = torch::zeros(p.sizes(), torch::kShort);   // master == bf16 weight
      } else {
        ps.master.data = p.detach().to(storage_scalar_type(master_dtype)).clone();
      }
      ps.exp_avg = zeros_state(p, cfg.exp_avg_dtype);
      ps.exp_avg_sq = zeros_state(p, cfg.exp_avg_sq_dtype);
      ps.main_grad = torch::zeros(p.sizes(), storage_scalar_type(cfg.main_grads_dtype));
      I.index[name] = I.params.size();
      I.params.push_back(std::move(ps));
    }
  }
}

PrecisionAdam::~PrecisionAdam() = default;
PrecisionAdam::PrecisionAdam(PrecisionAdam&&) noexcept = default;
PrecisionAdam& PrecisionAdam::operator=(PrecisionAdam&&) noexcept = default;

const OptimizerConfig& PrecisionAdam::config() const { return impl_->cfg; }
MasterMode PrecisionAdam::master_mode() const { return impl_->mode; }

std::string PrecisionAdam::describe() const {
  const Impl& I = *impl_;
  const auto& c = I.cfg;
  std::ostringstream os;
  os << (c.adam_w_mode ? "AdamW" : "Adam(L2)") << " precision_aware="
     << (c.use_precision_aware_optimizer ? "on" : "off") << " master=" << to_string(I.mode);
  if (I.mode == MasterMode::remainders) os << "(bf16 weight + int16 remainder)";
  os << " exp_avg=" << to_string(c.exp_avg_dtype) << " exp_avg_sq=" << to_string(c.exp_avg_sq_dtype)
     << " main_grads=" << to_string(c.main_grads_dtype) << " params=" << c10::toString(I.param_dtype)
     << " beta1=" << c.beta1 << " beta2=" << c.beta2 << " eps=" << c.eps;
  if (c.store_param_remainders && I.mode != MasterMode::remainders) {
    os << " store_param_remainders=true NOT in effect ("
       << (!c.use_precision_aware_optimizer ? "needs --use-precision-aware-optimizer"
           : c.main_params_dtype != Dtype::fp32 ? "needs fp32 --main-params-dtype"
                                                : "needs bf16 params")
       << ")";
  }
  return os.str();
}

void PrecisionAdam::accumulate_grads() {
  torch::NoGradGuard no_grad;
  for (auto& ps : impl_->params) {
    auto& grad = ps.param.mutable_grad();
    if (!grad.defined()) continue;
    if (grad.sizes() != ps.param.sizes())
      throw std::invalid_argument("accumulate_grads: grad of '" + ps.name + "' has the wrong shape");
    if (ps.main_grad.scalar_type() == torch::kFloat) {
      ps.main_grad.add_(grad);   // fp32 add of the widened grad: one rounding
    } else {                      // bf16 main grad: fp32 sum, then one RNE to bf16
      ps.main_grad.copy_(ps.main_grad.to(torch::kFloat) + grad.to(torch::kFloat));
    }
    ps.has_grad = true;
    grad = torch::Tensor();
  }
}

void PrecisionAdam::zero_grads() {
  for (auto& ps : impl_->params) {
    ps.main_grad.zero_();
    ps.has_grad = false;
  }
}

double PrecisionAdam::grad_norm() const {
  // Sum of squares in fp32 with an order that does not depend on the thread count: each
  // 4096-element block is reduced by one thread (a row reduction), the block sums are added on
  // the host in a fixed order.
  constexpr int64_t kBlock = 4096;
  float total = 0.0f;
  for (const auto& ps : impl_->params) {
    auto g = ps.main_grad.reshape({-1}).to(torch::kFloat);
    const int64_t n = g.numel(), pad = (kBlock - n % kBlock) % kBlock;
    auto sq = torch::constant_pad_nd(g * g, {0, pad}).view({-1, kBlock}).sum(1).contiguous();
    const float* b = sq.data_ptr<float>();
    for (int64_t i = 0; i < sq.numel(); ++i) total += b[i];
  }
  return static_cast<double>(std::sqrt(total));
}

void PrecisionAdam::scale_grads(float coef) {
  for (auto& ps : impl_->params) ps.main_grad.mul_(static_cast<double>(coef));
}

int64_t PrecisionAdam::count_zeros() const {
  int64_t z = 0;
  for (const auto& ps : impl_->params) z += ps.main_grad.eq(0).sum().item<int64_t>();
  return z;
}

const torch::Tensor& PrecisionAdam::main_grad(const std::string& param) const {
  return impl_->at(param).main_grad;
}

void PrecisionAdam::step(double lr) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  for (auto& s : I.steps) ++s;   // every group advances, whether or not its params have grads
  for (auto& ps : I.params) {
    if (!ps.has_grad) continue;
    const auto k = detail::make_step_scalars(I.cfg, I.group_wd[ps.group], lr, I.steps[ps.group]);
    detail::adam_update(ps, I.mode, k, I.ws);
  }
}

std::vector<std::string> PrecisionAdam::param_names() const {
  std::vector<std::string> out;
  for (const auto& ps : impl_->params) out.push_back(ps.name);
  return out;
}
const torch::Tensor& PrecisionAdam::param(const std::string& name) const {
  return impl_->at(name).param;
}
size_t PrecisionAdam::num_groups() const { return impl_->steps.size(); }
const std::string& PrecisionAdam::group_name(size_t g) const {
  impl_->check_group(g);
  return impl_->group_names[g];
}
size_t PrecisionAdam::group_of(const std::string& param) const { return impl_->at(param).group; }
int64_t PrecisionAdam::step_count(size_t g) const {
  impl_->check_group(g);
  return impl_->steps[g];
}
void PrecisionAdam::set_step_count(size_t g, int64_t step) {
  impl_->check_group(g);
  if (step < 0) throw std::invalid_argument("set_step_count: negative step for group " + std::to_string(g));
  impl_->steps[g] = step;
}

torch::Tensor PrecisionAdam::get_unscaled_state(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  ParamState& ps = I.at(param);
  const StoredState& st = I.state(ps, key);
  if (key == StateKey::master_param && I.mode == MasterMode::remainders)
    return codec::remainder_join(ps.param.detach(), st.data);
  if (scaled_moment(key, st.dtype))
    return codec::scaled_decode(st.data, st.dtype == Dtype::fp8, *st.scale);
  return st.data.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

void PrecisionAdam::set_scaled_state(const std::string& param, StateKey key,
                                     const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  ParamState& ps = I.at(param);
  StoredState& st = I.state(ps, key);
  if (!value.defined() || value.sizes() != ps.param.sizes() || !value.is_floating_point())
    throw std::invalid_argument("set_scaled_state: " + where(param, key) + " expects a floating "
                                "tensor of shape " + c10::str(ps.param.sizes()) + ", got " +
                                (value.defined() ? c10::str(value.scalar_type(), value.sizes())
                                                 : std::string("undefined")));
  auto v = value.detach().to(torch::kFloat).contiguous();
  if (key == StateKey::master_param) {
    if (I.mode == MasterMode::remainders) {
      torch::Tensor w, r;
      codec::remainder_split(v, w, r);
      st.data.copy_(r);
      ps.param.copy_(w);
    } else {
      st.data.copy_(v);          // fp16 master: RNE
      ps.param.copy_(st.data);   // the model param follows its master
    }
  } else if (scaled_moment(key, st.dtype)) {
    float scale = 1.0f;
    st.data.copy_(codec::scaled_encode(v, st.dtype == Dtype::fp8, scale));
    st.scale = scale;
  } else {
    st.data.copy_(v);            // fp32 copy or bf16 RNE
  }
}

const StoredState& PrecisionAdam::stored(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  return I.state(I.at(param), key);
}

void PrecisionAdam::set_stored(const std::string& param, StateKey key, const StoredState& s) {
  Impl& I = *impl_;
  StoredState& st = I.state(I.at(param), key);
  const std::string w = "set_stored: " + where(param, key);
  if (s.dtype != st.dtype)
    throw std::invalid_argument(w + " is held as " + to_string(st.dtype) + ", got " +
                                to_string(s.dtype) + " (master mode " + to_string(I.mode) + ")");
  if (!s.data.defined() || s.data.scalar_type() != st.data.scalar_type())
    throw std::invalid_argument(w + " expects data of type " + c10::toString(st.data.scalar_type()) +
                                ", got " + (s.data.defined() ? c10::toString(s.data.scalar_type()) : "undefined"));
  if (s.data.sizes() != st.data.sizes())
    throw std::invalid_argument(w + " expects shape " + c10::str(st.data.sizes()) + ", got " +
                                c10::str(s.data.sizes()));
  const bool scaled = scaled_moment(key, st.dtype);
  if (scaled != s.scale.has_value())
    throw std::invalid_argument(w + (scaled ? " needs a scale (" + to_string(st.dtype) + " moment)"
                                            : std::string(" takes no scale")));
  if (scaled && !(std::isfinite(*s.scale) && *s.scale > 0.0f))
    throw std::invalid_argument(w + ": scale must be finite and > 0, got " + std::to_string(*s.scale));
  st.data.copy_(s.data);   // same dtype: a bitwise copy
  st.scale = s.scale;
}

}  // namespace rh::optim
