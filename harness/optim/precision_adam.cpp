// PrecisionAdam: owns the per-parameter optimizer state, the main-grad buffers and the step
// counters; the update itself is adam_step.cpp, the storage formats storage_codecs.cpp.
#include "harness/optim/precision_adam.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <tuple>
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
  Collectives* comm = nullptr;                     // null: a group of one
  ShardLayout layout;
  std::vector<size_t> split;                       // params split across ranks
  std::vector<int> split_slot;                     // param index -> slot in `split`, or -1

  int dp_size() const { return layout.size; }

  ParamState& at(const std::string& name) {
    auto it = index.find(name);
    if (it == index.end())
      throw std::invalid_argument("PrecisionAdam: unknown param '" + name + "'");
    return params[it->second];
  }
  const ParamState& at(const std::string& name) const { return const_cast<Impl*>(this)->at(name); }
  static StoredState& state(ParamState& ps, StateKey key) {
    return key == StateKey::master_param ? ps.master
           : key == StateKey::exp_avg    ? ps.exp_avg
                                         : ps.exp_avg_sq;
  }
  static const StoredState& state(const ParamState& ps, StateKey key) {
    return state(const_cast<ParamState&>(ps), key);
  }
  void check_group(size_t g) const {
    if (g >= steps.size())
      throw std::out_of_range("PrecisionAdam: group " + std::to_string(g) + " out of range (" +
                              std::to_string(steps.size()) + " groups)");
  }
};

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

// Stores the owned part [begin, end) of the fp32 value `full` (the whole param) with TE's
// scaling (_apply_scale): the amax of the owned part (per shard, upstream), or of the whole
// tensor (`shared`).
void store_value_scaled(StoredState& st, const torch::Tensor& full, int64_t begin, int64_t end, bool guard,
                        bool shared, detail::Workspace& ws) {
  const torch::Tensor x = full.to(torch::kFloat).contiguous().view({-1});
  const torch::Tensor part = x.narrow(0, begin, end - begin);
  detail::store_scaled(st, part, codec::abs_max(shared ? x : part), guard, ws);
}

std::string where(const std::string& param, StateKey key) {
  return "param '" + param + "' state '" + key_name(key) + "'";
}

// The part of `p` a rank owns: p itself when whole, else a 1-D view of [begin, end).
torch::Tensor owned_part(const torch::Tensor& p, int64_t begin, int64_t end) {
  if (begin == 0 && end == p.numel()) return p;
  return p.view({-1}).narrow(0, begin, end - begin);
}
torch::Tensor owned_part(const ParamState& ps, const torch::Tensor& full) {
  return owned_part(full, ps.begin, ps.end);
}

// Per-4096-element block sums of squares of g (flat, fp32), one row reduction per block, padded
// with zeros: the same values whichever whole blocks of a tensor it is given.
constexpr int64_t kNormBlock = 4096;
torch::Tensor block_square_sums(const torch::Tensor& g) {
  const int64_t n = g.numel(), pad = (kNormBlock - n % kNormBlock) % kNormBlock;
  return torch::constant_pad_nd(g * g, {0, pad}).view({-1, kNormBlock}).sum(1).contiguous();
}

}  // namespace

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
    throw std::invalid_argument("PrecisionAdam: model_order names " + std::to_string(order.size()) + " params, the groups hold " +
                                std::to_string(numels.size()));
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
      if (I.index.count(name))
        throw std::invalid_argument("PrecisionAdam: param '" + name + "' appears twice");
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
  os << (c.adam_w_mode ? "AdamW" : "Adam(L2)") << " precision_aware="
     << (c.use_precision_aware_optimizer ? "on" : "off") << " master=" << to_string(I.mode);
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
         (!c.use_precision_aware_optimizer ? "needs --use-precision-aware-optimizer"
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

const torch::Tensor& PrecisionAdam::main_grad(const std::string& param) const {
  return impl_->at(param).main_grad;
}

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
double PrecisionAdam::weight_decay(size_t g) const {
  impl_->check_group(g);
  return impl_->group_wd[g];
}
void PrecisionAdam::set_weight_decay(size_t g, double wd) {
  impl_->check_group(g);
  if (!(wd >= 0) || !std::isfinite(wd))
    throw std::invalid_argument("set_weight_decay: weight decay must be finite and >= 0 for group " + std::to_string(g));
  impl_->group_wd[g] = wd;
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
  // fused_adam.py get_unscaled_state: the int16 remainder as it is (asserted int16 upstream);
  // fp16: float() * scale; fp8: the Float8Tensor's dequantize (code * scale_inv); bf16 widened.
  if (key == StateKey::master_param && I.mode == MasterMode::remainders) return st.data.clone();
  if (is_scaled(st.dtype)) return codec::scaled_decode(st.data, st.dtype == Dtype::fp8, st.decode_mult());
  return st.data.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

void PrecisionAdam::set_scaled_state(const std::string& param, StateKey key,
                                     const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  ParamState& ps = I.at(param);
  StoredState& st = I.state(ps, key);
  // fused_adam.py set_scaled_state: `assert unscaled_state.dtype == torch.int16` for master_param
  // under remainders, `== torch.float32` for everything else.
  const bool remainder = key == StateKey::master_param && I.mode == MasterMode::remainders;
  const auto want = remainder ? torch::kShort : torch::kFloat;
  if (!value.defined() || value.scalar_type() != want)
    throw std::invalid_argument("set_scaled_state: " + where(param, key) + " takes " +
                                (remainder ? "the int16 remainder" : std::string("an fp32 value")) + ", got " +
                                (value.defined() ? c10::toString(value.scalar_type()) : "undefined") +
                                " (upstream TransformerEngine fails an assertion here: FusedAdam.set_scaled_state "
                                "asserts unscaled_state.dtype == " + (remainder ? "torch.int16" : "torch.float32") + ")");
  const bool whole = value.sizes() == ps.param.sizes();
  if (!(whole || value.sizes() == st.data.sizes()))
    throw std::invalid_argument("set_scaled_state: " + where(param, key) + " expects shape " +
                                c10::str(ps.param.sizes()) +
                                (st.data.sizes() != ps.param.sizes() ? " or " + c10::str(st.data.sizes()) : "") +
                                ", got " + c10::str(value.sizes()));
  auto full = value.detach().contiguous();
  // The owned part, shaped like the state (a no-op unless the param is split).
  auto v = whole ? owned_part(ps, full).reshape(st.data.sizes()) : full;
  if (is_scaled(st.dtype)) {
    const bool shared = I.cfg.shared_dp_scale;
    if (shared && !whole && ps.end - ps.begin != ps.param.numel())
      throw std::invalid_argument("set_scaled_state: " + where(param, key) + " is scaled by the whole tensor's amax "
                                  "(shared_dp_scale); give the whole param's value");
    store_value_scaled(st, full, whole ? ps.begin : 0, whole ? ps.end : full.numel(), I.cfg.scale_zero_guard, shared, I.ws);
  } else {
    st.data.copy_(v);            // fp32 copy, bf16 RNE, or the int16 remainder
    if (st.dtype == Dtype::bf16) codec::canonical_nan_16_(st.data, v);
  }
}

const StoredState& PrecisionAdam::stored(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  return I.state(I.at(param), key);
}

void PrecisionAdam::check_stored(const std::string& param, StateKey key, const StoredState& s) const {
  const Impl& I = *impl_;
  const StoredState& st = Impl::state(I.at(param), key);
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
  const bool scaled = is_scaled(st.dtype), fp8 = st.dtype == Dtype::fp8;
  if (scaled != s.scale.has_value())
    throw std::invalid_argument(w + (scaled ? " needs a scale (" + to_string(st.dtype) + " state)"
                                            : std::string(" takes no scale")));
  if (fp8 != s.scale_inv.has_value())
    throw std::invalid_argument(w + (fp8 ? " needs a scale_inv (fp8 state)" : std::string(" takes no scale_inv")));
  if (!scaled) return;
  // scale = amax / range: >= 0, +inf, or NaN; never negative.
  if (std::signbit(*s.scale) && !std::isnan(*s.scale))
    throw std::invalid_argument(w + ": scale " + std::to_string(*s.scale) + " is negative (scale = amax / range)");
  if (fp8) {
    // scale_inv = frcp(1 / scale), with or without the zero guard: any other pair cannot come from TE.
    auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
    const float plain = codec::scaling_from_scale(*s.scale, true, false).scale_inv;
    const float guarded = codec::scaling_from_scale(*s.scale, true, true).scale_inv;
    if (!same(*s.scale_inv, plain) && !same(*s.scale_inv, guarded))
      throw std::invalid_argument(w + ": scale_inv " + std::to_string(*s.scale_inv) + " does not belong to scale " +
                                  std::to_string(*s.scale) + " (expected 1/(1/scale) = " + std::to_string(plain) +
                                  (same(plain, guarded) ? std::string() : ", or " + std::to_string(guarded) + " with scale_zero_guard") + ")");
  }
}

void PrecisionAdam::set_stored(const std::string& param, StateKey key, const StoredState& s) {
  check_stored(param, key, s);
  StoredState& st = impl_->state(impl_->at(param), key);
  st.data.copy_(s.data);   // same dtype: a bitwise copy
  st.scale = s.scale;
  st.scale_inv = s.scale_inv;
}

void PrecisionAdam::adopt_stored(const std::string& param, StateKey key, StoredState s) {
  check_stored(param, key, s);
  StoredState& st = impl_->state(impl_->at(param), key);
  st.data = s.data.is_contiguous() ? std::move(s.data) : s.data.contiguous();
  st.scale = s.scale;
  st.scale_inv = s.scale_inv;
}

}  // namespace rh::optim
