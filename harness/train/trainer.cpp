// The training loop; see trainer.h.
#include "harness/train/trainer.h"

#include "harness/optim/clip.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#ifdef RH_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace rh {

namespace {

torch::Generator make_generator(const torch::Device& device, uint64_t seed) {
#ifdef RH_WITH_CUDA
  if (device.is_cuda()) {
    auto g = at::make_generator<at::CUDAGeneratorImpl>(device.index() < 0 ? 0 : device.index());
    g.set_current_seed(seed);
    return g;
  }
#endif
  if (!device.is_cpu()) throw std::invalid_argument("device " + device.str() + " is not supported");
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

torch::Device parse_device(const std::string& device) {
  if (device == "cuda") {
#ifndef RH_WITH_CUDA
    throw std::invalid_argument("--device cuda: this build has no CUDA (LibTorch without CUDA)");
#else
    if (!torch::cuda::is_available()) throw std::invalid_argument("--device cuda: no CUDA device is available");
    return torch::Device(torch::kCUDA, 0);
#endif
  }
  return torch::Device(torch::kCPU);
}

// Megatron's default grouping: matrices decay, 1-D parameters (norm weights) do not.
std::vector<optim::ParamGroup> param_groups(models::CausalLM& model, double wd) {
  optim::ParamGroup decay{"decay", {}, wd}, no_decay{"no_decay", {}, 0.0};
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    (item.value().dim() >= 2 ? decay : no_decay).params.emplace_back(item.key(), item.value());
  std::vector<optim::ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

}   // namespace

Trainer::Trainer(const RunConfig& cfg, optim::Collectives* group)
    : cfg_(cfg),
      group_(group && group->size() > 1 ? group : nullptr),
      rank_(group_ ? group_->rank() : 0),
      dp_size_(group_ ? group_->size() : 1),
      device_(parse_device(cfg.train.device)),
      corpus_(cfg.train.data_seed, cfg.model.vocab_size, cfg.model.seq_len),
      dropout_gen_(make_generator(device_, cfg.train.seed ^ 0xD7D7D7D7ull)) {
  validate(cfg_);
  const int64_t n_micro = cfg_.train.global_batch / cfg_.train.micro_batch;
  if (n_micro % dp_size_ != 0)
    throw std::invalid_argument("data-parallel size " + std::to_string(dp_size_) + " does not divide the " +
                                std::to_string(n_micro) + " micro-batches of an iteration (train.global_batch " +
                                std::to_string(cfg_.train.global_batch) + " / train.micro_batch " +
                                std::to_string(cfg_.train.micro_batch) + ")");
  if (group_ && device_.is_cuda())
    throw std::invalid_argument(
        "data parallel on --device cuda needs ProcessGroupNCCL, which this build does not have");
  model_ = models::make_moe_transformer(cfg_.model, cfg_.train.seed, device_);
  model_->train();
  // Megatron's buffers hold the model's params (module.parameters() order) reversed, whatever
  // the optimizer's grouping: the data-parallel layout follows the model's order.
  std::vector<std::string> model_order;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) model_order.push_back(item.key());
  optimizer_ = std::make_unique<optim::PrecisionAdam>(param_groups(*model_, cfg_.optim.weight_decay), cfg_.optim,
                                                      group_, model_order);
  state_.opt_param_scheduler = scheduler_from_config(cfg_);
  sched_args_ = scheduler_args_from_config(cfg_);
}

IterMetrics Trainer::train_iteration() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t micro_batch = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const int64_t n_micro = cfg_.train.global_batch / micro_batch;
  optimizer_->zero_grads();
  auto lm_sum = torch::zeros({}, torch::kFloat), aux_sum = torch::zeros({}, torch::kFloat);
  std::vector<int64_t> tokens(static_cast<size_t>(micro_batch * T)), targets(tokens.size());
  const int64_t first = rank_ * n_micro / dp_size_, last = (rank_ + 1) * n_micro / dp_size_;
  // Dropout: one draw from the run's generator per iteration (every rank holds the same one),
  // then a stream per micro-batch seeded from that draw and the micro-batch's index. A sample
  // sees the same mask whichever rank runs it, so runs at different data-parallel sizes differ
  // only by the order of their reductions; the generator's state is still training state.
  const uint64_t draw = static_cast<uint64_t>(torch::randint(std::numeric_limits<int64_t>::max(), {1}, dropout_gen_,
                                                             torch::TensorOptions().dtype(torch::kLong).device(device_))
                                                  .item<int64_t>());
  for (int64_t micro = first; micro < last; ++micro) {
    torch::Generator micro_gen = make_generator(device_, mix64(draw ^ static_cast<uint64_t>(micro)));
    corpus_.fill(state_.consumed_samples + micro * micro_batch, micro_batch, tokens.data(), targets.data());
    auto x = torch::from_blob(tokens.data(), {micro_batch, T}, torch::kLong).to(device_);
    auto y = torch::from_blob(targets.data(), {micro_batch, T}, torch::kLong).to(device_);
    auto out = model_->loss(x, y, &micro_gen);
    // schedules.py forward_step_calc_loss (Megatron-LM main @d98e8a6, lines 344-346 and 366):
    // the loss and the MoE aux loss's scale are divided by num_microbatches, the rank's own count
    // (get_num_microbatches: global batch / (micro batch x dp)); reduce_grads then multiplies by
    // 1/dp before the SUM. Equal bits to dividing by the global count only when dp is a power of 2.
    auto loss = (out.lm_loss + out.aux_loss) / static_cast<float>(last - first);
    loss.backward();
    optimizer_->accumulate_grads();
    lm_sum += out.lm_loss.detach().to(torch::kCPU, torch::kFloat);
    aux_sum += out.aux_loss.detach().to(torch::kCPU, torch::kFloat);
  }
  optimizer_->reduce_grads();
  update_expert_bias();
  // Megatron steps every param (main grads in a buffer, zero for an expert without tokens).
  optimizer_->mark_all_grads();
  if (group_) {   // the loss sums over the group (in rank order, see PrecisionAdam::reduce_grads)
    auto sums = torch::stack({lm_sum, aux_sum});
    group_->all_reduce_sum(sums);
    lm_sum = sums[0];
    aux_sum = sums[1];
  }
  IterMetrics metrics;
  metrics.lm_loss = (lm_sum / static_cast<float>(n_micro)).item<float>();
  metrics.aux_loss = (aux_sum / static_cast<float>(n_micro)).item<float>();
  metrics.total_loss = metrics.lm_loss + metrics.aux_loss;
  metrics.grad_norm = optimizer_->grad_norm();
  if (cfg_.train.clip_grad > 0) {   // harness/optim/clip.h: Megatron's fp32 coefficient
    const float coeff = optim::clip_coefficient(static_cast<float>(metrics.grad_norm), cfg_.train.clip_grad);
    if (!(coeff == 1.0f)) optimizer_->scale_grads(coeff);
  }
  metrics.num_zeros = optimizer_->count_zeros();
  // The scheduler's values at its current num_steps are the ones this step uses (Megatron's
  // train_step: optimizer.step(), then opt_param_scheduler.step(increment = global batch), which
  // sets lr and weight_decay for the next step; its constructor's step(0) set the first ones).
  // Groups other than "decay" have wd_mult 0 (Megatron's no-weight-decay groups).
  metrics.lr = scheduler_lr(state_.opt_param_scheduler, sched_args_);
  const double wd = scheduler_wd(state_.opt_param_scheduler);
  for (size_t g = 0; g < optimizer_->num_groups(); ++g)
    if (optimizer_->group_name(g) == "decay") optimizer_->set_weight_decay(g, wd * 1.0);
  optimizer_->step(metrics.lr);
  state_.opt_param_scheduler.num_steps += cfg_.train.global_batch;
  state_.consumed_samples += cfg_.train.global_batch;
  state_.iteration += 1;
  metrics.iteration = state_.iteration;
  metrics.consumed_samples = state_.consumed_samples;
  metrics.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics.tokens_per_s = static_cast<double>(cfg_.train.global_batch * T) / metrics.seconds;
  return metrics;
}

torch::Tensor updated_expert_bias(const torch::Tensor& tokens_per_expert, const torch::Tensor& expert_bias,
                                  double rate) {
  // moe_utils.py get_updated_expert_bias, after its all-reduce
  const int64_t E = tokens_per_expert.size(-1);
  auto average_tokens = tokens_per_expert.sum(-1, /*keepdim=*/true) / E;
  auto offset = average_tokens - tokens_per_expert;
  return expert_bias + torch::sign(offset) * rate;
}

// megatron/core/distributed/finalize_model_grads.py _update_router_expert_bias (run once per
// iteration after the micro-batches, before the optimizer step) and moe_utils.py
// get_updated_expert_bias: the routers' token counters stacked (L, E), all-reduced over the
// data-parallel group (fp32 sums of integer counts: exact, so every group size gets the same
// bias), average = sum / E, bias += sign(average - tokens) * rate, then the counters are zeroed.
void Trainer::update_expert_bias() {
  auto states = model_->expert_bias_states();
  if (states.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tokens, biases;
  for (const auto& s : states) {
    tokens.push_back(s.local_tokens_per_expert);
    biases.push_back(s.expert_bias);
  }
  auto stacked_tokens = torch::stack(tokens, 0).to(torch::kCPU);   // (L, E) fp32
  if (group_) group_->all_reduce_sum(stacked_tokens);
  auto stacked_bias = torch::stack(biases, 0).to(torch::kCPU);   // (L, E) fp32
  auto updated = updated_expert_bias(stacked_tokens, stacked_bias, cfg_.model.bias_update_rate);
  for (size_t i = 0; i < states.size(); ++i) {
    states[i].local_tokens_per_expert.zero_();
    states[i].expert_bias.copy_(updated[static_cast<int64_t>(i)]);
  }
}

ckpt::TrainState Trainer::state() const {
  ckpt::TrainState train_state = state_;
  auto bytes = dropout_gen_.get_state().contiguous();
  const auto* p = bytes.data_ptr<uint8_t>();
  train_state.rng_states["dropout"] = std::vector<uint8_t>(p, p + bytes.numel());
  return train_state;
}

void Trainer::set_state(const ckpt::TrainState& train_state, bool restore_rng) {
  if (restore_rng) {
    auto it = train_state.rng_states.find("dropout");
    if (it == train_state.rng_states.end())
      throw std::invalid_argument("training state has no RNG state for generator 'dropout'");
    auto dropout_state = torch::empty({static_cast<int64_t>(it->second.size())}, torch::kByte);
    std::memcpy(dropout_state.data_ptr<uint8_t>(), it->second.data(), it->second.size());
    dropout_gen_.set_state(dropout_state);
  }
  auto current_rng_states = state_.rng_states;
  state_ = train_state;
  state_.rng_states = current_rng_states;
}

uint64_t tensor_xxh3(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU).contiguous();
  return XXH3_64bits(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

std::vector<std::pair<std::string, uint64_t>> Trainer::fingerprints() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  // The non-tensor state first, so a first divergence names it when only it differs.
  const auto train_state = state();
  auto bytes_hash = [](const void* p, size_t n) { return XXH3_64bits(p, n); };
  out.emplace_back("state/rng.dropout", bytes_hash(train_state.rng_states.at("dropout").data(),
                                                   train_state.rng_states.at("dropout").size()));
  out.emplace_back("state/consumed_samples", bytes_hash(&train_state.consumed_samples, sizeof(int64_t)));
  // The scheduler's state_dict, key by key, in upstream's order (a fault that breaks one is named).
  for (const auto& field : ckpt::scheduler_fields())
    std::visit(
        [&](auto member) {
          const auto& value = train_state.opt_param_scheduler.*member;
          std::string key = std::string("state/opt_param_scheduler.") + field.key;
          if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::string>)
            out.emplace_back(std::move(key), bytes_hash(value.data(), value.size()));
          else out.emplace_back(std::move(key), bytes_hash(&value, sizeof value));
        },
        field.member);
  for (size_t g = 0; g < optimizer_->num_groups(); ++g) {
    const int64_t step = optimizer_->step_count(g);
    out.emplace_back("state/step." + optimizer_->group_name(g), bytes_hash(&step, sizeof step));
  }
  for (const auto& item : model_->named_parameters(true))
    out.emplace_back("model/" + item.key(), tensor_xxh3(item.value()));
  for (const auto& item : model_->named_buffers(true))   // persistent model state (expert_bias)
    out.emplace_back("model/" + item.key(), tensor_xxh3(item.value()));
  const optim::StateKey state_keys[] = {optim::StateKey::master_param, optim::StateKey::exp_avg,
                                        optim::StateKey::exp_avg_sq};
  for (const auto& name : optimizer_->param_names()) {
    const auto range = optimizer_->shard_range(name);
    if (range.first == range.second) continue;   // another rank's part of the state
    for (auto state_key : state_keys) {
      const auto& stored = optimizer_->stored(name, state_key);
      std::string key = name + "/" +
                        (state_key == optim::StateKey::master_param && stored.dtype == optim::Dtype::int16
                             ? std::string("remainder")
                             : std::string(optim::key_name(state_key)));
      out.emplace_back(key, tensor_xxh3(stored.data));
      if (stored.scale) out.emplace_back(key + ".scale", XXH3_64bits(&*stored.scale, sizeof(float)));
      if (stored.scale_inv) out.emplace_back(key + ".scale_inv", XXH3_64bits(&*stored.scale_inv, sizeof(float)));
    }
  }
  return out;
}

}   // namespace rh
