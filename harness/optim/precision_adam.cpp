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

// Upstream's data-parallel gradient path (Megatron-LM main @d98e8a64ddf34856e74b24714e3bedb2f5a39553):
//  - distributed_data_parallel.py DistributedDataParallel.__init__, lines 244-278: without
//    calculate_per_token_loss and average_in_collective (both off by default),
//    gradient_scaling_factor = 1.0 / data_parallel_world_size (a Python double).
//  - param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync, lines 661-667:
//    `bucket.grad_data *= bucket.gradient_scaling_factor` (skipped when it is 1.0) on each rank's
//    whole bucket, in place, in the grad buffer's dtype (torch multiplies in fp32, the scalar
//    rounded to fp32, and rounds back to bf16 once); lines 669-672 reduce_op = SUM; lines
//    707-723 one reduce-scatter per bucket into the rank's shard (shard_buffer: dp equal
//    contiguous pieces). The grad buffer's dtype is the param dtype unless grad_reduce_in_fp32
//    (group_params_for_buffers, line 924), which training/arguments.py lines 1204-1216 leaves off
//    for bf16 params with --main-grads-dtype bf16: those grads reduce in bf16. Here the buffer
//    dtype is main_grads_dtype.
//  - The order of the sums is NCCL's: Megatron's deterministic mode pins NCCL_ALGO=Ring
//    (docs/user-guide/deterministic-training.md line 30, same commit), and NCCL's ring
//    reduce-scatter (NVIDIA/nccl master @5067397c2676d5aed50042fc39e5c8ee96eb0027,
//    src/device/reduce_scatter.h runRing, lines 39-53) starts shard d at the rank after d, each
//    later rank adds its own value to what it received, and rank d adds its own last:
//    ((g[d+1] + g[d+2]) + ...) + g[d], indices mod dp, every add rounded to the buffer's dtype
//    (src/device/reduce_kernel.h lines 451 and 461: bf16 sums are __hadd, or float add rounded
//    to bf16; the two agree for bf16 operands). The ring is assumed to be in rank order (NCCL
//    builds it from the topology). At dp 2 the order cannot matter (one commutative add).
// A ring over Gloo would still depend on Gloo's own algorithm, so the ranks all-gather their
// scaled buffers (bytes) and each rank sums its own shard in that order.
namespace {

// The ring's sum of one shard: values[r] is rank r's contribution, `owner` the shard's rank.
// Elementwise fp32 adds; `round` rounds after every add (bf16 buffers).
template <typename Round>
torch::Tensor ring_sum(const std::vector<torch::Tensor>& values, int owner, Round round) {
  const int dp = static_cast<int>(values.size());
  torch::Tensor acc = values[static_cast<size_t>((owner + 1) % dp)].to(torch::kFloat).clone();
  for (int j = 2; j <= dp; ++j) {
    acc.add_(values[static_cast<size_t>((owner + j) % dp)].to(torch::kFloat));
    round(acc);
  }
  return acc;
}

}   // namespace

void PrecisionAdam::reduce_grads() {
  Impl& I = *impl_;
  if (I.dp_size() == 1) return;   // gradient_scaling_factor 1.0, a reduce-scatter over one rank
  torch::NoGradGuard no_grad;
  const int dp = I.dp_size();
  const auto& layout = I.layout;
  const auto grad_type = storage_scalar_type(I.cfg.main_grads_dtype);   // kFloat or kBFloat16
  const bool bf16 = grad_type == torch::kBFloat16;
  const int64_t elem = bf16 ? 2 : 4, num_params = static_cast<int64_t>(I.params.size());
  // On the wire: the rank's scaled buffer (its dtype, padding 0), then one "has grad" byte per
  // param, padded to 8 bytes so that every rank's buffer in the gathered bytes stays aligned.
  const int64_t grad_bytes = layout.total * elem, bytes = grad_bytes + (num_params + 7) / 8 * 8;
  auto send = torch::zeros({bytes}, torch::kByte);
  auto send_grads = send.narrow(0, 0, grad_bytes).view(grad_type);
  auto* marks = send.data_ptr<uint8_t>() + grad_bytes;
  const auto factor = torch::scalar_tensor(static_cast<float>(1.0 / dp), torch::kFloat);   // fp32(1/dp)
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& param_state = I.params[i];
    auto g = param_state.main_grad.view({-1});
    if (bf16) g.copy_(g.to(torch::kFloat).mul_(factor));   // fp32 multiply, one RNE to bf16
    else g.mul_(factor);
    send_grads.narrow(0, layout.offsets[i], g.numel()).copy_(g);
    marks[i] = param_state.has_grad ? 1 : 0;
  }
  auto recv = torch::empty({bytes * dp}, torch::kByte);
  I.comm->all_gather_bytes(send, recv);
  const auto* recv_bytes = recv.data_ptr<uint8_t>();
  auto round = [bf16](torch::Tensor& acc) {
    if (bf16) acc.copy_(acc.to(torch::kBFloat16));
  };
  for (size_t i = 0; i < I.params.size(); ++i) {
    auto& param_state = I.params[i];
    bool any = false;
    for (int r = 0; r < dp; ++r) any = any || recv_bytes[r * bytes + grad_bytes + static_cast<int64_t>(i)] != 0;
    param_state.has_grad = any;
    const int64_t len = param_state.end - param_state.begin;
    if (len == 0) continue;
    std::vector<torch::Tensor> values;
    for (int r = 0; r < dp; ++r)
      values.push_back(recv.narrow(0, r * bytes, grad_bytes)
                           .view(grad_type)
                           .narrow(0, layout.offsets[i] + param_state.begin, len));
    // The shard now holds the sum; the rest of the param's main grad keeps this rank's own
    // scaled grads, as upstream's buffer does outside the rank's shard.
    param_state.main_grad.view({-1}).narrow(0, param_state.begin, len).copy_(ring_sum(values, layout.rank, round));
  }
}

// megatron/core/optimizer/clip_grads.py get_grad_norm_fp32 (Megatron-LM main @d98e8a6), with
// TE present: grad_norm = multi_tensor_l2norm(the rank's shard grads) (line 116: an fp32 sqrt of
// the shard's sum of squares), `total_norm = grad_norm**norm_type` (line 121: fp32 x*x),
// all_reduce SUM over grad_stats_parallel_group (line 132; the distributed optimizer's
// instance, all data-parallel ranks: distrib_optimizer.py get_grad_stats_parallel_group, lines
// 796-802), then `total_norm.pow(1.0 / norm_type)` (line 136: an fp32 sqrt).
// At dp 1 this equals the sqrt of the sum: sqrt(fl(s * s)) == s in binary floating point when
// s * s neither overflows nor underflows.
// Two orders are ours, not upstream's: the shard's sum of squares (TE's multi_tensor_l2norm
// reduces per CUDA block; here per-4096-element block sums of each owned piece, added in param
// order: independent of the thread count) and the all-reduce of the squares (NCCL's ring over
// one element, modelled as the reduce-scatter's ring for shard 0: ((q[1] + q[2]) + ...) + q[0]).
double PrecisionAdam::grad_norm() const {
  const Impl& I = *impl_;
  float shard = 0.0f;
  for (const auto& param_state : I.params) {
    const int64_t len = param_state.end - param_state.begin;
    if (len == 0) continue;
    auto g = param_state.main_grad.reshape({-1}).narrow(0, param_state.begin, len).to(torch::kFloat);
    auto block_sums = block_square_sums(g);
    const float* b = block_sums.data_ptr<float>();
    for (int64_t i = 0; i < block_sums.numel(); ++i) shard += b[i];
  }
  volatile float shard_norm = std::sqrt(shard);   // volatile: one fp32 rounding each, no FMA
  volatile float square = shard_norm * shard_norm;
  float total = square;
  if (I.dp_size() > 1) {
    auto mine = torch::full({1}, static_cast<float>(square), torch::kFloat);
    auto all = torch::empty({I.dp_size()}, torch::kFloat);
    auto all_bytes = all.view(torch::kByte);
    I.comm->all_gather_bytes(mine.view(torch::kByte), all_bytes);
    std::vector<torch::Tensor> values;
    for (int r = 0; r < I.dp_size(); ++r) values.push_back(all.narrow(0, r, 1));
    total = ring_sum(values, 0, [](torch::Tensor&) {}).item<float>();
  }
  return static_cast<double>(std::sqrt(total));
}

void PrecisionAdam::scale_grads(float coef) {
  // clip_grad_by_total_norm_fp32 scales the grads the optimizer steps (the rank's shard) with
  // TE's multi_tensor_scale (transformer_engine/common/multi_tensor/scale.cu lines 71 and 92,
  // TE main @d0067d0): `r_out = float(r_in) * scale`, an fp32 multiply by the fp32 coefficient,
  // rounded to the grads' dtype. (LibTorch 1.13's bf16 mul_ by a Scalar rounds it to bf16 first.)
  const auto factor = torch::scalar_tensor(coef, torch::kFloat);
  for (auto& ps : impl_->params) {
    if (ps.end == ps.begin) continue;
    auto g = ps.main_grad.view({-1}).narrow(0, ps.begin, ps.end - ps.begin);
    if (g.scalar_type() == torch::kFloat) g.mul_(factor);
    else g.copy_(g.to(torch::kFloat).mul_(factor));
  }
}

int64_t PrecisionAdam::count_zeros() const {
  // clip_grads.py count_zeros_fp32 (lines 254 and 271 @d98e8a6): zeros of the rank's shard grads,
  // all-reduced (SUM) over the world: every element of every param counted once.
  const Impl& I = *impl_;
  int64_t zeros = 0;
  for (const auto& ps : I.params)
    if (ps.end > ps.begin)
      zeros += ps.main_grad.view({-1}).narrow(0, ps.begin, ps.end - ps.begin).eq(0).sum().item<int64_t>();
  if (I.dp_size() == 1) return zeros;
  auto mine = torch::full({1}, zeros, torch::kLong);
  auto all = torch::empty({I.dp_size()}, torch::kLong);
  auto all_bytes = all.view(torch::kByte);
  I.comm->all_gather_bytes(mine.view(torch::kByte), all_bytes);
  return all.sum().item<int64_t>();
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
