// ModelConfig validation, the numerics it resolves to, and the generator-driven dropout every
// layer shares. Messages name the field and the expected range so a bad TOML is fixed at once.
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "models/model.h"
#include "models/numerics.h"

namespace rh::models {
namespace {

[[noreturn]] void bad_field(const std::string& field, const std::string& got, const std::string& expected) {
  throw std::invalid_argument("ModelConfig." + field + " (" + got + ") " + expected);
}

void require_positive(const std::string& field, int64_t v) {
  if (v <= 0) bad_field(field, std::to_string(v), "must be > 0");
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// [lo, hi) for probabilities that must leave something to keep; NaN fails every comparison.
void require_unit_interval(const std::string& field, double v) {
  if (!(v >= 0.0 && v < 1.0)) bad_field(field, num(v), "must be in [0, 1)");
}

void require_nonneg_finite(const std::string& field, double v) {
  if (!(std::isfinite(v) && v >= 0.0)) bad_field(field, num(v), "must be finite and >= 0");
}

void require_positive_finite(const std::string& field, double v) {
  if (!(std::isfinite(v) && v > 0.0)) bad_field(field, num(v), "must be finite and > 0");
}

}   // namespace

void validate_config(const ModelConfig& cfg) {
  require_positive("vocab_size", cfg.vocab_size);
  require_positive("seq_len", cfg.seq_len);
  require_positive("d_model", cfg.d_model);
  require_positive("n_layers", cfg.n_layers);
  require_positive("n_heads", cfg.n_heads);
  if (cfg.d_model % cfg.n_heads != 0)
    bad_field("d_model", std::to_string(cfg.d_model), "must be divisible by n_heads = " + std::to_string(cfg.n_heads));
  if ((cfg.d_model / cfg.n_heads) % 2 != 0)
    bad_field("n_heads", std::to_string(cfg.n_heads),
              "must give an even head dim d_model / n_heads for RoPE (got " +
                  std::to_string(cfg.d_model / cfg.n_heads) + ")");
  require_positive("n_experts", cfg.n_experts);
  if (cfg.top_k < 1 || cfg.top_k > cfg.n_experts)
    bad_field("top_k", std::to_string(cfg.top_k), "must be in [1, n_experts = " + std::to_string(cfg.n_experts) + "]");
  if (cfg.score_function != "softmax" && cfg.score_function != "sigmoid")
    bad_field("score_function", cfg.score_function, "must be softmax or sigmoid");
  // transformer_config.py __post_init__: "Expert bias for aux-loss-free routing only supports
  // sigmoid score function."
  if (cfg.enable_expert_bias && cfg.score_function != "sigmoid")
    bad_field("enable_expert_bias", "true",
              "needs score_function sigmoid: expert bias for aux-loss-free routing only supports sigmoid score "
              "function "
              "(Megatron's transformer_config.py refuses it with softmax)");
  require_nonneg_finite("bias_update_rate", cfg.bias_update_rate);
  if (!std::isfinite(cfg.capacity_factor))
    bad_field("capacity_factor", num(cfg.capacity_factor), "must be finite (< 0 = no token dropping)");
  if (cfg.token_drop_policy != "probs" && cfg.token_drop_policy != "position")
    bad_field("token_drop_policy", "\"" + cfg.token_drop_policy + "\"", "must be \"probs\" or \"position\"");
  // transformer_config.py __post_init__: "moe_expert_capacity_factor must be set to use
  // moe_pad_expert_input_to_capacity".
  if (cfg.pad_to_capacity && cfg.capacity_factor < 0.0)
    bad_field("pad_to_capacity", "true",
              "needs capacity_factor >= 0: moe_expert_capacity_factor must be set to use "
              "moe_pad_expert_input_to_capacity");
  if (cfg.router_dtype != "none" && cfg.router_dtype != "fp32" && cfg.router_dtype != "fp64")
    bad_field("router_dtype", "\"" + cfg.router_dtype + "\"", "must be \"none\", \"fp32\" or \"fp64\"");
  if (cfg.dead_expert < -1 || cfg.dead_expert >= cfg.n_experts)
    bad_field("dead_expert", std::to_string(cfg.dead_expert),
              "must be -1 (none) or an expert index in [0, n_experts = " + std::to_string(cfg.n_experts) + ")");
  if (cfg.dead_expert >= 0 && cfg.top_k >= cfg.n_experts)
    bad_field("dead_expert", std::to_string(cfg.dead_expert),
              "needs top_k < n_experts (top_k = " + std::to_string(cfg.top_k) + " would route to every expert)");
  require_positive("ffn_hidden", cfg.ffn_hidden);
  require_nonneg_finite("aux_loss_coeff", cfg.aux_loss_coeff);
  require_nonneg_finite("z_loss_coeff", cfg.z_loss_coeff);
  require_unit_interval("dropout", cfg.dropout);
  require_unit_interval("router_jitter", cfg.router_jitter);
  require_positive_finite("rope_theta", cfg.rope_theta);
  require_positive_finite("norm_eps", cfg.norm_eps);
  require_positive_finite("init_std", cfg.init_std);
  if (cfg.param_dtype != "bf16" && cfg.param_dtype != "fp32")
    bad_field("param_dtype", "\"" + cfg.param_dtype + "\"", "must be \"bf16\" or \"fp32\"");
  if (cfg.compute != "auto" && cfg.compute != "fp32" && cfg.compute != "native")
    bad_field("compute", "\"" + cfg.compute + "\"", "must be \"auto\", \"fp32\" or \"native\"");
}

Numerics resolve_numerics(const ModelConfig& cfg, const torch::Device& device) {
  Numerics numerics;
  if (cfg.param_dtype == "fp32") return numerics;   // compute mode is irrelevant for fp32 params
  numerics.param_dtype = torch::kBFloat16;
  const bool native = cfg.compute == "native" || (cfg.compute == "auto" && device.is_cuda());
  numerics.compute_dtype = native ? torch::kBFloat16 : torch::kFloat;
  numerics.round_to_bf16 = !native;
  return numerics;
}

std::string Numerics::name() const {
  if (param_dtype == torch::kFloat) return "fp32";
  return round_to_bf16 ? "bf16/fp32-compute" : "bf16/native";
}

torch::Tensor dropout_fp32(const torch::Tensor& x, double p, bool training, torch::Generator* gen) {
  if (!training || p == 0.0) return x.to(torch::kFloat);
  if (gen == nullptr)
    throw std::invalid_argument(
        "dropout: training with dropout > 0 needs a torch::Generator (got null); pass the "
        "generator the caller checkpoints, or call eval()");
  // Drawn on the generator's device so a CPU generator also drives a CUDA model (same bits).
  auto mask = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kFloat).device(gen->device()));
  mask.bernoulli_(1.0 - p, *gen);
  mask = mask.to(x.device()).mul_(1.0 / (1.0 - p));
  return x.to(torch::kFloat) * mask;
}

}   // namespace rh::models
