// PrecisionAdam: owns the per-parameter optimizer state, the main-grad buffers and the step
// counters; the update itself is adam_step.cpp, the storage formats storage_codecs.cpp.
// The state exchanged with checkpoints (upstream's get_unscaled_state / set_scaled_state, the raw
// stored form) is precision_adam_state.cpp.
#include "harness/optim/precision_adam.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "harness/optim/adam_step.h"
#include "harness/optim/precision_adam_impl.h"
#include "harness/optim/storage_codecs.h"

namespace rh::optim {

using detail::ParamState;

namespace {

// TE's fresh state (FusedAdam._initialize_state): zeros, and for fp16/fp8 a scale of 1 (fp8: a
// quantizer with scale 1, so scale_inv 1).
StoredState zeros_state(const torch::Tensor& like, Dtype d) {
  StoredState s;
  s.dtype = d;
  s.data = torch::zeros(like.sizes(), storage_scalar_type(d));
  if (d == Dtype::fp16 || d == Dtype::fp8) s.scale = codec::initial_scaling().scale;
  if (d == Dtype::fp8) s.scale_inv = codec::initial_scaling().scale_inv;
  return s;
}

using detail::is_scaled;
using detail::owned_part;
using detail::store_value_scaled;

// Per-4096-element block sums of squares of g (flat, fp32), one row reduction per block, padded
// with zeros: the same values whichever whole blocks of a tensor it is given.
constexpr int64_t kNormBlock = 4096;
torch::Tensor block_square_sums(const torch::Tensor& g) {
  const int64_t n = g.numel(), pad = (kNormBlock - n % kNormBlock) % kNormBlock;
  return torch::constant_pad_nd(g * g, {0, pad}).view({-1, kNormBlock}).sum(1).contiguous();
}

}   // namespace

PrecisionAdam::PrecisionAdam(std::vector<ParamGroup> groups, OptimizerConfig cfg, Collectives* comm,
                             const std::vector<std::string>& model_order)
    : impl_(std::make_unique<Impl>()) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  I.cfg = cfg;
  I.comm = comm;
  bool have_dtype = false;
  for (const auto& g : groups)
    for (const auto& [name, p] : g.params) {
      if (!p.defined()) throw std::invalid_argument("PrecisionAdam: param '" + name + "' is undefined");
      if (!have_dtype) I.param_dtype = p.scalar_type(), have_dtype = true;
      if (p.scalar_type() != I.param_dtype)
        throw std::invalid_argument("PrecisionAdam: param '" + name + "' is " + c10::toString(p.scalar_type()) +
                                    " but earlier params are " + c10::toString(I.param_dtype) +
                                    "; all params share one dtype");
      if (!p.device().is_cpu() || !p.is_contiguous())
        throw std::invalid_argument("PrecisionAdam: param '" + name +
                                    "' must be a contiguous CPU tensor (its state is updated "
                                    "through flat views)");
    }
  validate(cfg, I.param_dtype);
  I.mode = effective_master_mode(cfg, I.param_dtype);
  std::vector<int64_t> numels;
  std::unordered_map<std::string, size_t> position;   // name -> optimizer order
  for (const auto& g : groups)
    for (const auto& np : g.params) {
      position.emplace(np.first, numels.size());
      numels.push_back(np.second.numel());
    }
  std::vector<size_t> order;   // optimizer indices in the model's order
  for (const auto& name : model_order) {
    auto it = position.find(name);
    if (it == position.end())
      throw std::invalid_argument("PrecisionAdam: model_order names '" + name + "', which no group holds");
    order.push_back(it->second);
  }
  if (!model_order.empty() && order.size() != numels.size())
    throw std::invalid_argument("PrecisionAdam: model_order names " + std::to_string(order.size()) +
                                " params, the groups hold " + std::to_string(numels.size()));
  const BufferOptions bo{cfg.ddp_bucket_size, cfg.ddp_pad_buckets_for_high_nccl_busbw};
  try {
    I.layout = ShardLayout::make(numels, comm ? comm->rank() : 0, comm ? comm->size() : 1, bo, order);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("PrecisionAdam: ") + e.what() + " (model_order repeats a name?)");
  }
  I.split = I.layout.split_params();
  I.split_slot.assign(numels.size(), -1);
  for (size_t s = 0; s < I.split.size(); ++s) I.split_slot[I.split[s]] = static_cast<int>(s);
  const Dtype master_dtype = I.mode == MasterMode::fp32   ? Dtype::fp32
                             : I.mode == MasterMode::fp16 ? Dtype::fp16
                                                          : Dtype::int16;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    I.group_names.push_back(groups[gi].name);
    I.group_wd.push_back(groups[gi].weight_decay);
    I.steps.push_back(0);
    for (auto& [name, p] : groups[gi].params) {
      if (I.index.count(name)) throw std::invalid_argument("PrecisionAdam: param '" + name + "' appears twice");
      ParamState ps;
      ps.name = name;
      ps.group = gi;
      ps.param = p;
      std::tie(ps.begin, ps.end) = I.layout.piece(I.params.size());
      const torch::Tensor owned = owned_part(ps, p.detach());
      ps.master.dtype = master_dtype;
      if (I.mode == MasterMode::remainders) {
        ps.master.data = torch::zeros(owned.sizes(), torch::kShort);   // master == bf16 weight
      } else if (I.mode == MasterMode::fp16) {
        // initialize_state: set_scaled_state(param, "master_param", param.float()) of the
        // rank's shard (scaled by its amax; the whole param's with shared_dp_scale).
        ps.master.data = torch::empty(owned.sizes(), torch::kHalf);
        store_value_scaled(ps.master, p.detach(), ps.begin, ps.end, cfg.scale_zero_guard, cfg.shared_dp_scale, I.ws);
      } else {
        ps.master.data = owned.to(storage_scalar_type(master_dtype)).clone();
      }
      ps.exp_avg = zeros_state(owned, cfg.exp_avg_dtype);
      ps.exp_avg_sq = zeros_state(owned, cfg.exp_avg_sq_dtype);
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
  os << (c.adam_w_mode ? "AdamW" : "Adam(L2)")
     << " precision_aware=" << (c.use_precision_aware_optimizer ? "on" : "off") << " master=" << to_string(I.mode);
  if (I.mode == MasterMode::remainders) os << "(bf16 weight + int16 remainder)";
  os << " exp_avg=" << to_string(c.exp_avg_dtype) << " exp_avg_sq=" << to_string(c.exp_avg_sq_dtype)
     << " main_grads=" << to_string(c.main_grads_dtype) << " params=" << c10::toString(I.param_dtype)
     << " beta1=" << c.beta1 << " beta2=" << c.beta2 << " eps=" << c.eps;
  if (I.dp_size() > 1) os << " distributed(" << I.layout.describe() << ")";
  return os.str();
}

std::string PrecisionAdam::remainders_note() const {
  const Impl& I = *impl_;
  const auto& c = I.cfg;
  if (!c.store_param_remainders || I.mode == MasterMode::remainders) return "";
  return std::string("store_param_remainders=true NOT in effect (") +
         (!c.use_precision_aware_optimizer     ? "needs --use-precision-aware-optimizer"
          : c.main_params_dtype != Dtype::fp32 ? "needs fp32 --main-params-dtype"
                                               : "needs bf16 params") +
         ")";
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
    } else {                     // bf16 main grad: fp32 sum, then one RNE to bf16
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

void PrecisionAdam::mark_all_grads() {
  for (auto& ps : impl_->params) ps.has_grad = true;
}

void PrecisionAdam::reduce_grads() {
  Impl& I = *impl_;
  if (I.dp_size() == 1) return;
  torch::NoGradGuard no_grad;
  const int64_t total = I.layout.total, np = static_cast<int64_t>(I.params.size());
  auto buf = torch::zeros({total + np}, torch::kFloat);   // grads (padding 0), then one "has grad" mark each
  float* marks = buf.data_ptr<float>() + total;
  for (size_t i = 0; i < I.params.size(); ++i) {
    const auto& ps = I.params[i];
    buf.narrow(0, I.layout.offsets[i], ps.main_grad.numel()).copy_(ps.main_grad.view({-1}));
    marks[i] = ps.has_grad ? 1.0f : 0.0f;
  }
  I.comm->all_reduce_sum(buf);
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& ps = I.params[i];
    ps.main_grad.view({-1}).copy_(buf.narrow(0, I.layout.offsets[i], ps.main_grad.numel()));
    ps.has_grad = marks[i] > 0.0f;
  }
}

double PrecisionAdam::grad_norm() const {
  // Sum of squares in fp32 with an order that depends on neither the thread count nor the group
  // size: each 4096-element block is reduced by one thread (a row reduction), the block sums are
  // added on the host in a fixed order.
  const Impl& I = *impl_;
  float total = 0.0f;
  if (I.dp_size() == 1) {
    for (const auto& ps : I.params) {
      auto sq = block_square_sums(ps.main_grad.reshape({-1}).to(torch::kFloat));
      const float* b = sq.data_ptr<float>();
      for (int64_t i = 0; i < sq.numel(); ++i) total += b[i];
    }
    return static_cast<double>(std::sqrt(total));
  }
  // A block belongs to the rank owning its first element; the owned blocks of a param are
  // consecutive. Every slot of the all-reduced vector has exactly one non-zero term.
  std::vector<int64_t> first(I.params.size() + 1, 0);
  for (size_t i = 0; i < I.params.size(); ++i)
    first[i + 1] = first[i] + (I.layout.numels[i] + kNormBlock - 1) / kNormBlock;
  auto sums = torch::zeros({first.back()}, torch::kFloat);
  for (size_t i = 0; i < I.params.size(); ++i) {
    const int64_t n = I.layout.numels[i], off = I.layout.offsets[i];
    int64_t j0 = -1, j1 = -1;
    for (int64_t j = 0; j * kNormBlock < n; ++j)
      if (I.layout.owner(off + j * kNormBlock) == I.layout.rank) {
        if (j0 < 0) j0 = j;
        j1 = j + 1;
      }
    if (j0 < 0) continue;
    const int64_t s = j0 * kNormBlock, e = std::min(n, j1 * kNormBlock);
    auto g = I.params[i].main_grad.reshape({-1}).narrow(0, s, e - s).to(torch::kFloat);
    sums.narrow(0, first[i] + j0, j1 - j0).copy_(block_square_sums(g));
  }
  I.comm->all_reduce_sum(sums);
  const float* b = sums.data_ptr<float>();
  for (int64_t i = 0; i < sums.numel(); ++i) total += b[i];
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

const torch::Tensor& PrecisionAdam::main_grad(const std::string& param) const { return impl_->at(param).main_grad; }

void PrecisionAdam::step(double lr) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  for (auto& s : I.steps) ++s;   // every group advances, whether or not its params have grads
  const bool m_scaled = is_scaled(I.cfg.exp_avg_dtype);
  const bool v_scaled = is_scaled(I.cfg.exp_avg_sq_dtype);
  const bool p_scaled = I.mode == MasterMode::fp16;
  // Per-shard scaling (upstream) needs nothing from the other ranks; only shared_dp_scale defers
  // the split params' scaled states until the group agrees on their amax.
  const bool defer_scales =
      I.cfg.shared_dp_scale && I.dp_size() > 1 && (m_scaled || v_scaled || p_scaled) && !I.split.empty();
  std::vector<detail::Deferred> deferred(I.split.size());
  std::vector<bool> did(I.split.size(), false);
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& ps = I.params[i];
    if (!ps.has_grad || ps.begin == ps.end) continue;
    const auto k = detail::make_step_scalars(I.cfg, I.group_wd[ps.group], lr, I.steps[ps.group]);
    const int slot = I.split_slot[i];
    detail::Deferred* d = defer_scales && slot >= 0 ? &deferred[static_cast<size_t>(slot)] : nullptr;
    detail::adam_update(ps, I.mode, k, I.ws, d);
    if (d) did[static_cast<size_t>(slot)] = true;
  }
  if (I.dp_size() == 1) return;
  if (defer_scales) {
    // Per split param and scaled state (m, v, fp16 master): amax, has-NaN; max over ranks
    // (non-owners add 0).
    constexpr int64_t kPer = 6;
    const int64_t ns = static_cast<int64_t>(I.split.size());
    auto a = torch::zeros({kPer * ns}, torch::kFloat);
    float* A = a.data_ptr<float>();
    auto put = [](float* dst, float amax) {
      if (std::isnan(amax)) dst[1] = 1.0f;
      else dst[0] = amax;
    };
    for (int64_t s = 0; s < ns; ++s)
      if (did[static_cast<size_t>(s)]) {
        const auto& d = deferred[static_cast<size_t>(s)];
        put(A + kPer * s, d.m_amax);
        put(A + kPer * s + 2, d.v_amax);
        put(A + kPer * s + 4, d.p_amax);
      }
    I.comm->all_reduce_max(a);
    auto global = [](const float* src) { return src[1] > 0.0f ? std::nanf("") : src[0]; };
    const bool guard = I.cfg.scale_zero_guard;
    for (int64_t s = 0; s < ns; ++s) {
      if (!did[static_cast<size_t>(s)]) continue;
      auto& ps = I.params[I.split[static_cast<size_t>(s)]];
      auto& d = deferred[static_cast<size_t>(s)];
      if (m_scaled) detail::store_scaled(ps.exp_avg, d.m_full, global(A + kPer * s), guard, I.ws);
      if (v_scaled) detail::store_scaled(ps.exp_avg_sq, d.v_full, global(A + kPer * s + 2), guard, I.ws);
      if (p_scaled) detail::store_scaled(ps.master, d.p_full, global(A + kPer * s + 4), guard, I.ws);
    }
  }
  sync_params();
}

void PrecisionAdam::sync_params() {
  // All-gather the params (Megatron's param all-gather per bucket, all buckets at once here):
  // rank r sends its range of every bucket, concatenated (ShardLayout::local_index).
  Impl& I = *impl_;
  if (I.dp_size() == 1) return;
  torch::NoGradGuard no_grad;
  const auto& L = I.layout;
  const int64_t es = I.params.empty() ? 1 : I.params[0].param.element_size();
  const int64_t shard_bytes = L.per_rank() * es;
  auto send = torch::zeros({shard_bytes}, torch::kByte);
  auto recv = torch::empty({shard_bytes * I.dp_size()}, torch::kByte);
  auto* sp = static_cast<char*>(send.data_ptr());
  for (size_t i = 0; i < I.params.size(); ++i) {
    const auto& ps = I.params[i];
    if (ps.begin == ps.end) continue;
    std::memcpy(sp + L.local_index(L.rank, L.offsets[i] + ps.begin) * es,
                static_cast<const char*>(ps.param.data_ptr()) + ps.begin * es,
                static_cast<size_t>((ps.end - ps.begin) * es));
  }
  I.comm->all_gather_bytes(send, recv);
  const auto* rp = static_cast<const char*>(recv.data_ptr());
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& ps = I.params[i];
    for (int r = 0; r < I.dp_size(); ++r) {
      const auto [b, e] = L.piece(i, r);
      if (b == e) continue;
      std::memcpy(static_cast<char*>(ps.param.data_ptr()) + b * es,
                  rp + (r * L.per_rank() + L.local_index(r, L.offsets[i] + b)) * es, static_cast<size_t>((e - b) * es));
    }
  }
}

std::vector<std::string> PrecisionAdam::param_names() const {
  std::vector<std::string> out;
  for (const auto& ps : impl_->params) out.push_back(ps.name);
  return out;
}
const ShardLayout& PrecisionAdam::layout() const { return impl_->layout; }
std::pair<int64_t, int64_t> PrecisionAdam::shard_range(const std::string& param) const {
  const auto& ps = impl_->at(param);
  return {ps.begin, ps.end};
}
const torch::Tensor& PrecisionAdam::param(const std::string& name) const { return impl_->at(name).param; }
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
double PrecisionAdam::weight_decay(size_t g) const {
  impl_->check_group(g);
  return impl_->group_wd[g];
}
void PrecisionAdam::set_weight_decay(size_t g, double wd) {
  impl_->check_group(g);
  if (!(wd >= 0) || !std::isfinite(wd))
    throw std::invalid_argument("set_weight_decay: weight decay must be finite and >= 0 for group " +
                                std::to_string(g));
  impl_->group_wd[g] = wd;
}
void PrecisionAdam::set_step_count(size_t g, int64_t step) {
  impl_->check_group(g);
  if (step < 0) throw std::invalid_argument("set_step_count: negative step for group " + std::to_string(g));
  impl_->steps[g] = step;
}

}   // namespace rh::optim
