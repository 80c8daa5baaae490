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
StoredState zeros_state(const torch::Tensor& like, Dtype dtype) {
  StoredState state;
  state.dtype = dtype;
  state.data = torch::zeros(like.sizes(), storage_scalar_type(dtype));
  if (dtype == Dtype::fp16 || dtype == Dtype::fp8) state.scale = codec::initial_scaling().scale;
  if (dtype == Dtype::fp8) state.scale_inv = codec::initial_scaling().scale_inv;
  return state;
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
  for (const auto& group : groups)
    for (const auto& [name, p] : group.params) {
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
  for (const auto& group : groups)
    for (const auto& named_param : group.params) {
      position.emplace(named_param.first, numels.size());
      numels.push_back(named_param.second.numel());
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
  const BufferOptions buffer_options{cfg.ddp_bucket_size, cfg.ddp_pad_buckets_for_high_nccl_busbw};
  try {
    I.layout = ShardLayout::make(numels, comm ? comm->rank() : 0, comm ? comm->size() : 1, buffer_options, order);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("PrecisionAdam: ") + e.what() + " (model_order repeats a name?)");
  }
  I.split = I.layout.split_params();
  I.split_slot.assign(numels.size(), -1);
  for (size_t s = 0; s < I.split.size(); ++s) I.split_slot[I.split[s]] = static_cast<int>(s);
  const Dtype master_dtype = I.mode == MasterMode::fp32   ? Dtype::fp32
                             : I.mode == MasterMode::fp16 ? Dtype::fp16
                                                          : Dtype::int16;
  for (size_t group_index = 0; group_index < groups.size(); ++group_index) {
    I.group_names.push_back(groups[group_index].name);
    I.group_wd.push_back(groups[group_index].weight_decay);
    I.steps.push_back(0);
    for (auto& [name, p] : groups[group_index].params) {
      if (I.index.count(name)) throw std::invalid_argument("PrecisionAdam: param '" + name + "' appears twice");
      ParamState param_state;
      param_state.name = name;
      param_state.group = group_index;
      param_state.param = p;
      std::tie(param_state.begin, param_state.end) = I.layout.piece(I.params.size());
      const torch::Tensor owned = owned_part(param_state, p.detach());
      param_state.master.dtype = master_dtype;
      if (I.mode == MasterMode::remainders) {
        param_state.master.data = torch::zeros(owned.sizes(), torch::kShort);   // master == bf16 weight
      } else if (I.mode == MasterMode::fp16) {
        // initialize_state: set_scaled_state(param, "master_param", param.float()) of the
        // rank's shard (scaled by its amax; the whole param's with shared_dp_scale).
        param_state.master.data = torch::empty(owned.sizes(), torch::kHalf);
        store_value_scaled(param_state.master, p.detach(), param_state.begin, param_state.end, cfg.scale_zero_guard,
                           cfg.shared_dp_scale, I.ws);
      } else {
        param_state.master.data = owned.to(storage_scalar_type(master_dtype)).clone();
      }
      param_state.exp_avg = zeros_state(owned, cfg.exp_avg_dtype);
      param_state.exp_avg_sq = zeros_state(owned, cfg.exp_avg_sq_dtype);
      param_state.main_grad = torch::zeros(p.sizes(), storage_scalar_type(cfg.main_grads_dtype));
      I.index[name] = I.params.size();
      I.params.push_back(std::move(param_state));
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
  const auto& cfg = I.cfg;
  std::ostringstream os;
  os << (cfg.adam_w_mode ? "AdamW" : "Adam(L2)")
     << " precision_aware=" << (cfg.use_precision_aware_optimizer ? "on" : "off") << " master=" << to_string(I.mode);
  if (I.mode == MasterMode::remainders) os << "(bf16 weight + int16 remainder)";
  os << " exp_avg=" << to_string(cfg.exp_avg_dtype) << " exp_avg_sq=" << to_string(cfg.exp_avg_sq_dtype)
     << " main_grads=" << to_string(cfg.main_grads_dtype) << " params=" << c10::toString(I.param_dtype)
     << " beta1=" << cfg.beta1 << " beta2=" << cfg.beta2 << " eps=" << cfg.eps;
  if (I.dp_size() > 1) os << " distributed(" << I.layout.describe() << ")";
  return os.str();
}

std::string PrecisionAdam::remainders_note() const {
  const Impl& I = *impl_;
  const auto& cfg = I.cfg;
  if (!cfg.store_param_remainders || I.mode == MasterMode::remainders) return "";
  return std::string("store_param_remainders=true NOT in effect (") +
         (!cfg.use_precision_aware_optimizer     ? "needs --use-precision-aware-optimizer"
          : cfg.main_params_dtype != Dtype::fp32 ? "needs fp32 --main-params-dtype"
                                                 : "needs bf16 params") +
         ")";
}

void PrecisionAdam::accumulate_grads() {
  torch::NoGradGuard no_grad;
  for (auto& param_state : impl_->params) {
    auto& grad = param_state.param.mutable_grad();
    if (!grad.defined()) continue;
    if (grad.sizes() != param_state.param.sizes())
      throw std::invalid_argument("accumulate_grads: grad of '" + param_state.name + "' has the wrong shape");
    if (param_state.main_grad.scalar_type() == torch::kFloat) {
      param_state.main_grad.add_(grad);   // fp32 add of the widened grad: one rounding
    } else {                              // bf16 main grad: fp32 sum, then one RNE to bf16
      param_state.main_grad.copy_(param_state.main_grad.to(torch::kFloat) + grad.to(torch::kFloat));
    }
    param_state.has_grad = true;
    grad = torch::Tensor();
  }
}

void PrecisionAdam::zero_grads() {
  for (auto& param_state : impl_->params) {
    param_state.main_grad.zero_();
    param_state.has_grad = false;
  }
}

void PrecisionAdam::mark_all_grads() {
  for (auto& ps : impl_->params) ps.has_grad = true;
}

void PrecisionAdam::reduce_grads() {
  Impl& I = *impl_;
  if (I.dp_size() == 1) return;
  torch::NoGradGuard no_grad;
  const int64_t total = I.layout.total, num_params = static_cast<int64_t>(I.params.size());
  auto buf = torch::zeros({total + num_params}, torch::kFloat);   // grads (padding 0), then one "has grad" mark each
  float* marks = buf.data_ptr<float>() + total;
  for (size_t i = 0; i < I.params.size(); ++i) {
    const auto& param_state = I.params[i];
    buf.narrow(0, I.layout.offsets[i], param_state.main_grad.numel()).copy_(param_state.main_grad.view({-1}));
    marks[i] = param_state.has_grad ? 1.0f : 0.0f;
  }
  I.comm->all_reduce_sum(buf);
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& param_state = I.params[i];
    param_state.main_grad.view({-1}).copy_(buf.narrow(0, I.layout.offsets[i], param_state.main_grad.numel()));
    param_state.has_grad = marks[i] > 0.0f;
  }
}

double PrecisionAdam::grad_norm() const {
  // Sum of squares in fp32 with an order that depends on neither the thread count nor the group
  // size: each 4096-element block is reduced by one thread (a row reduction), the block sums are
  // added on the host in a fixed order.
  const Impl& I = *impl_;
  float total = 0.0f;
  if (I.dp_size() == 1) {
    for (const auto& param_state : I.params) {
      auto block_sums = block_square_sums(param_state.main_grad.reshape({-1}).to(torch::kFloat));
      const float* b = block_sums.data_ptr<float>();
      for (int64_t i = 0; i < block_sums.numel(); ++i) total += b[i];
    }
    return static_cast<double>(std::sqrt(total));
  }
  // A block belongs to the rank owning its first element; the owned blocks of a param are
  // consecutive. Every slot of the all-reduced vector has exactly one non-zero term.
  std::vector<int64_t> first_block(I.params.size() + 1, 0);
  for (size_t i = 0; i < I.params.size(); ++i)
    first_block[i + 1] = first_block[i] + (I.layout.numels[i] + kNormBlock - 1) / kNormBlock;
  auto sums = torch::zeros({first_block.back()}, torch::kFloat);
  for (size_t i = 0; i < I.params.size(); ++i) {
    const int64_t n = I.layout.numels[i], offset = I.layout.offsets[i];
    int64_t block_begin = -1, block_end = -1;
    for (int64_t j = 0; j * kNormBlock < n; ++j)
      if (I.layout.owner(offset + j * kNormBlock) == I.layout.rank) {
        if (block_begin < 0) block_begin = j;
        block_end = j + 1;
      }
    if (block_begin < 0) continue;
    const int64_t begin = block_begin * kNormBlock, end = std::min(n, block_end * kNormBlock);
    auto g = I.params[i].main_grad.reshape({-1}).narrow(0, begin, end - begin).to(torch::kFloat);
    sums.narrow(0, first_block[i] + block_begin, block_end - block_begin).copy_(block_square_sums(g));
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
  int64_t zeros = 0;
  for (const auto& ps : impl_->params) zeros += ps.main_grad.eq(0).sum().item<int64_t>();
  return zeros;
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
  std::vector<bool> has_deferred(I.split.size(), false);
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& param_state = I.params[i];
    if (!param_state.has_grad || param_state.begin == param_state.end) continue;
    const auto scalars =
        detail::make_step_scalars(I.cfg, I.group_wd[param_state.group], lr, I.steps[param_state.group]);
    const int slot = I.split_slot[i];
    detail::Deferred* defer = defer_scales && slot >= 0 ? &deferred[static_cast<size_t>(slot)] : nullptr;
    detail::adam_update(param_state, I.mode, scalars, I.ws, defer);
    if (defer) has_deferred[static_cast<size_t>(slot)] = true;
  }
  if (I.dp_size() == 1) return;
  if (defer_scales) {
    // Per split param and scaled state (m, v, fp16 master): amax, has-NaN; max over ranks
    // (non-owners add 0).
    constexpr int64_t kPer = 6;
    const int64_t num_split = static_cast<int64_t>(I.split.size());
    auto amaxes = torch::zeros({kPer * num_split}, torch::kFloat);
    float* amaxes_data = amaxes.data_ptr<float>();
    auto put = [](float* dst, float amax) {
      if (std::isnan(amax)) dst[1] = 1.0f;
      else dst[0] = amax;
    };
    for (int64_t slot = 0; slot < num_split; ++slot)
      if (has_deferred[static_cast<size_t>(slot)]) {
        const auto& deferral = deferred[static_cast<size_t>(slot)];
        put(amaxes_data + kPer * slot, deferral.m_amax);
        put(amaxes_data + kPer * slot + 2, deferral.v_amax);
        put(amaxes_data + kPer * slot + 4, deferral.p_amax);
      }
    I.comm->all_reduce_max(amaxes);
    auto global = [](const float* src) { return src[1] > 0.0f ? std::nanf("") : src[0]; };
    const bool guard = I.cfg.scale_zero_guard;
    for (int64_t slot = 0; slot < num_split; ++slot) {
      if (!has_deferred[static_cast<size_t>(slot)]) continue;
      auto& param_state = I.params[I.split[static_cast<size_t>(slot)]];
      auto& deferral = deferred[static_cast<size_t>(slot)];
      if (m_scaled)
        detail::store_scaled(param_state.exp_avg, deferral.m_full, global(amaxes_data + kPer * slot), guard, I.ws);
      if (v_scaled)
        detail::store_scaled(param_state.exp_avg_sq, deferral.v_full, global(amaxes_data + kPer * slot + 2), guard,
                             I.ws);
      if (p_scaled)
        detail::store_scaled(param_state.master, deferral.p_full, global(amaxes_data + kPer * slot + 4), guard, I.ws);
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
  const auto& layout = I.layout;
  const int64_t elem_size = I.params.empty() ? 1 : I.params[0].param.element_size();
  const int64_t shard_bytes = layout.per_rank() * elem_size;
  auto send = torch::zeros({shard_bytes}, torch::kByte);
  auto recv = torch::empty({shard_bytes * I.dp_size()}, torch::kByte);
  auto* send_bytes = static_cast<char*>(send.data_ptr());
  for (size_t i = 0; i < I.params.size(); ++i) {
    const auto& param_state = I.params[i];
    if (param_state.begin == param_state.end) continue;
    std::memcpy(send_bytes + layout.local_index(layout.rank, layout.offsets[i] + param_state.begin) * elem_size,
                static_cast<const char*>(param_state.param.data_ptr()) + param_state.begin * elem_size,
                static_cast<size_t>((param_state.end - param_state.begin) * elem_size));
  }
  I.comm->all_gather_bytes(send, recv);
  const auto* recv_bytes = static_cast<const char*>(recv.data_ptr());
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& param_state = I.params[i];
    for (int r = 0; r < I.dp_size(); ++r) {
      const auto [begin, end] = layout.piece(i, r);
      if (begin == end) continue;
      std::memcpy(static_cast<char*>(param_state.param.data_ptr()) + begin * elem_size,
                  recv_bytes + (r * layout.per_rank() + layout.local_index(r, layout.offsets[i] + begin)) * elem_size,
                  static_cast<size_t>((end - begin) * elem_size));
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
