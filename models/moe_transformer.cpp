// The MoE transformer's assembly, seeded init, input checks and losses: see moe_transformer.h.
// Shapes: B batch, T sequence, C d_model, V vocab, E experts, N = B*T tokens.
#include "models/moe_transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <sstream>
#include <stdexcept>

namespace rh::models {

TransformerBlockImpl::TransformerBlockImpl(const ModelConfig& cfg, const Numerics& n, const torch::Device& device)
    : hidden_dropout(cfg.dropout), num(n) {
  attention_norm = register_module("attention_norm", RMSNorm(cfg.d_model, cfg.norm_eps, num, device));
  attention = register_module("attention", CausalSelfAttention(cfg, num, device));
  moe_norm = register_module("moe_norm", RMSNorm(cfg.d_model, cfg.norm_eps, num, device));
  moe = register_module("moe", MoELayer(cfg, num, device));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, torch::Generator* gen, RouterOutput* routing) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  auto attn_out = attention->forward(attention_norm(x), gen);
  auto h = num.act(x + dropout_fp32(attn_out, hidden_dropout, is_training(), gen));   // (B, T, C)
  auto [moe_out, r] = moe->forward(moe_norm(h).view({B * T, C}), gen);
  *routing = std::move(r);
  return num.act(h + dropout_fp32(moe_out.view({B, T, C}), hidden_dropout, is_training(), gen));
}

MoETransformer::MoETransformer(const ModelConfig& cfg, const torch::Device& device) : cfg_(cfg), device_(device) {
  validate_config(cfg_);
  num_ = resolve_numerics(cfg_, device_);
  embedding = register_module("embedding", TokenEmbedding(cfg_.vocab_size, cfg_.d_model, num_, device_));
  auto list = register_module("layers", torch::nn::ModuleList());
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    layers.push_back(TransformerBlock(cfg_, num_, device_));
    list->push_back(layers.back());
  }
  final_norm = register_module("final_norm", RMSNorm(cfg_.d_model, cfg_.norm_eps, num_, device_));
  lm_head = register_module("lm_head", NoBiasLinear(cfg_.d_model, cfg_.vocab_size, num_, device_));
}

void MoETransformer::init_parameters(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters(/*recurse=*/true)) {
    auto& p = item.value();
    if (p.dim() == 1) {   // only the RMSNorm weights are vectors
      p.fill_(1.0);
    } else {
      auto values = torch::empty(p.sizes(), torch::TensorOptions().dtype(torch::kFloat));
      values.normal_(0.0, cfg_.init_std, gen);
      p.copy_(values);   // fp32 -> param dtype (round to nearest even), CPU -> device
    }
  }
}

void MoETransformer::check_tokens(const torch::Tensor& tokens, const char* what) const {
  auto fail = [&](const std::string& msg) {
    throw std::invalid_argument(std::string("MoETransformer: ") + what + " " + msg);
  };
  if (!tokens.defined()) fail("is undefined");
  if (tokens.dim() != 2) fail("must be (B, T), got " + std::to_string(tokens.dim()) + " dims");
  if (tokens.scalar_type() != torch::kLong)
    fail("must be int64, got " + std::string(c10::toString(tokens.scalar_type())));
  if (tokens.size(0) < 1 || tokens.size(1) < 1 || tokens.size(1) > cfg_.seq_len)
    fail("must have B >= 1 and 1 <= T <= seq_len = " + std::to_string(cfg_.seq_len) + ", got (" +
         std::to_string(tokens.size(0)) + ", " + std::to_string(tokens.size(1)) + ")");
  const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
  if (lo < 0 || hi >= cfg_.vocab_size)
    fail("ids must be in [0, vocab_size = " + std::to_string(cfg_.vocab_size) + "), got range [" + std::to_string(lo) +
         ", " + std::to_string(hi) + "]");
}

ForwardOutput MoETransformer::forward(const torch::Tensor& tokens, torch::Generator* gen) {
  check_tokens(tokens, "tokens");
  ForwardOutput out;
  out.aux_loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  out.tokens_per_expert.assign(cfg_.n_experts, 0);
  auto x = embedding(tokens.to(device_));   // (B, T, C)
  for (auto& block : layers) {
    RouterOutput routing;
    x = block->forward(x, gen, &routing);
    out.aux_loss = out.aux_loss + routing.aux_loss;
    for (int64_t e = 0; e < cfg_.n_experts; ++e) out.tokens_per_expert[e] += routing.tokens_per_expert[e];
  }
  out.logits = lm_head(final_norm(x)).to(torch::kFloat);   // (B, T, V)
  return out;
}

LossOutput MoETransformer::loss(const torch::Tensor& tokens, const torch::Tensor& targets, torch::Generator* gen) {
  check_tokens(targets, "targets");
  if (targets.sizes() != tokens.sizes())
    throw std::invalid_argument("MoETransformer: targets must have the shape of tokens");
  auto fwd = forward(tokens, gen);
  const int64_t V = cfg_.vocab_size;
  LossOutput out;
  out.lm_loss = torch::cross_entropy_loss(fwd.logits.reshape({-1, V}), targets.to(device_).reshape({-1}));
  out.aux_loss = fwd.aux_loss;
  out.tokens_per_expert = std::move(fwd.tokens_per_expert);
  return out;
}

int64_t MoETransformer::num_parameters() const {
  int64_t count = 0;
  for (const auto& p : parameters()) count += p.numel();
  return count;
}

std::string MoETransformer::describe() const {
  std::ostringstream os;
  os << "moe-transformer L=" << cfg_.n_layers << " C=" << cfg_.d_model << " H=" << cfg_.n_heads
     << " E=" << cfg_.n_experts << " K=" << cfg_.top_k << " F=" << cfg_.ffn_hidden << " V=" << cfg_.vocab_size
     << " T=" << cfg_.seq_len << " params=" << num_parameters() << " numerics=" << num_.name()
     << " router=" << cfg_.score_function << (cfg_.enable_expert_bias ? "+expert_bias" : "")
     << " device=" << device_.str();
  return os.str();
}

std::vector<ExpertBiasState> MoETransformer::expert_bias_states() {
  std::vector<ExpertBiasState> out;
  for (auto& block : layers)
    if (block->moe->enable_expert_bias) out.push_back({block->moe->expert_bias, block->moe->local_tokens_per_expert});
  return out;
}

std::shared_ptr<CausalLM> make_moe_transformer(const ModelConfig& cfg, uint64_t seed, const torch::Device& device) {
  auto model = std::make_shared<MoETransformer>(cfg, device);
  model->init_parameters(seed);
  return model;
}

}   // namespace rh::models
