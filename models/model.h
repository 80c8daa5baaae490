// The model interface the harness trains through, and the tiny MoE transformer's config.
// models/ knows nothing of optimizers or checkpoints: it builds modules, owns their parameters and
// computes losses. The harness sees only CausalLM and torch::nn::Module's named parameters.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rh::models {

// Dimension names used in shape comments: B batch, T sequence, C d_model, H heads, D head dim,
// E experts, K top-k, F expert hidden size, V vocab, N tokens (B*T).
struct ModelConfig {
  int64_t vocab_size = 256;   // V
  int64_t seq_len = 64;       // T, also the RoPE table length
  int64_t d_model = 128;      // C
  int64_t n_layers = 2;       // L
  int64_t n_heads = 4;        // H, D = C / H (must be even for RoPE)
  int64_t n_experts = 4;      // E
  int64_t top_k = 2;          // K
  // Not a Megatron option: an expert index the router never selects (-1 = none), so that expert
  // receives no tokens and its gradients stay exactly zero, as a dead MoE expert's do.
  int64_t dead_expert = -1;
  // Router scoring (Megatron --moe-router-score-function): "softmax" (over the top-k logits,
  // Megatron's default without pre-softmax) or "sigmoid" (top-k of sigmoid scores, normalised to
  // sum 1 when K > 1).
  std::string score_function = "softmax";
  // Aux-loss-free balancing (Megatron --moe-router-enable-expert-bias, sigmoid only): each router
  // holds a persistent fp32 buffer expert_bias (E) added to the scores for choosing experts only,
  // and counts the tokens routed to each expert; the trainer updates the bias after each
  // iteration by bias_update_rate (--moe-router-bias-update-rate).
  bool enable_expert_bias = false;
  double bias_update_rate = 1e-3;
  // Token dropping (Megatron --moe-expert-capacity-factor, transformer_config.py: None = dropless,
  // and __post_init__ turns a negative factor into None): < 0 here = none. Each expert keeps at
  // most capacity = ceil(N*K / E * factor) token-expert pairs (moe_utils.py get_capacity); the
  // rest get weight 0 for that expert. token_drop_policy (--moe-token-drop-policy): "probs" keeps
  // the highest routing probabilities, "position" the earliest tokens.
  double capacity_factor = -1.0;
  std::string token_drop_policy = "probs";
  // --moe-pad-expert-input-to-capacity: every expert processes exactly `capacity` tokens (the
  // capacity mask becomes the routing map, the extra rows at probability 0); needs a capacity
  // factor (transformer_config.py __post_init__ refuses it without one).
  bool pad_to_capacity = false;
  // Router logits dtype (Megatron --moe-router-dtype, router.py TopKRouter.gating): "fp32",
  // "fp64", or "none" (upstream's default: the router input's dtype, bf16 in bf16 modes). Our
  // default stays fp32, what this model always did (see README).
  std::string router_dtype = "fp32";
  int64_t ffn_hidden = 256;       // F, per expert (SwiGLU: gate+up are 2F wide)
  double aux_loss_coeff = 1e-2;   // load-balancing loss coefficient
  double z_loss_coeff = 0.0;      // router z-loss coefficient (0 = off; 1e-3 usual)
  double dropout = 0.1;           // on attention probs and hidden states (residual branches)
  double router_jitter = 0.0;     // router input multiplied by U(1-j, 1+j) in training (0 = off)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;   // RMSNorm epsilon (Megatron's layernorm_epsilon default)
  double init_std = 0.02;
  std::string param_dtype = "bf16";   // bf16 | fp32: the dtype parameters are held in
  // How bf16-held parameters compute: "fp32" casts weights to fp32 for every op and rounds each
  // linear/attention output (and every other activation a bf16 model holds: norms, residuals,
  // expert outputs; see models/numerics.h) to bf16, fast on CPUs without bf16 units; "native"
  // runs the ops in bf16 (what a GPU does). "auto" = native on CUDA, fp32 on CPU. Ignored for
  // fp32 params.
  std::string compute = "auto";
};

// Scalars (0-dim fp32 tensors) from one forward pass.
struct LossOutput {
  torch::Tensor lm_loss;                    // mean next-token cross-entropy
  torch::Tensor aux_loss;                   // load-balancing + z-loss, summed over layers (already scaled by coeff)
  std::vector<int64_t> tokens_per_expert;   // summed over layers, for diagnostics
};

// One router's aux-loss-free balancing state, as views of the model's own tensors (updates in
// place reach the model): expert_bias (E) fp32, a registered (persistent) buffer; the token
// counter (E) fp32, not persistent (Megatron's local_tokens_per_expert, persistent=False).
struct ExpertBiasState {
  torch::Tensor expert_bias;
  torch::Tensor local_tokens_per_expert;
};

// Every registered buffer of a CausalLM is persistent state (saved with the weights, as
// PyTorch's persistent buffers are); non-persistent tensors are not registered.
// A causal language model the harness can train. Dropout and router jitter draw only from the
// generator passed in, so the caller owns (and can checkpoint) every random-number state.
class CausalLM : public torch::nn::Module {
 public:
  // tokens, targets: (B, T) int64. gen: used when is_training(); may be null only in eval.
  virtual LossOutput loss(const torch::Tensor& tokens, const torch::Tensor& targets, torch::Generator* gen) = 0;
  virtual std::string describe() const = 0;   // one line: architecture and parameter count
  // The routers' expert-bias states (empty without expert bias), in layer order.
  virtual std::vector<ExpertBiasState> expert_bias_states() { return {}; }
};

// Throws std::invalid_argument naming the first bad field (e.g. "ModelConfig.top_k (5) must be in
// [1, n_experts = 4]"). make_moe_transformer calls it; the harness may call it early too.
void validate_config(const ModelConfig& cfg);

// Builds the MoE transformer with parameters initialized from `seed` (bit-identical for the same
// seed and config), on `device`, held in cfg.param_dtype. Throws std::invalid_argument naming the
// field on a bad config.
std::shared_ptr<CausalLM> make_moe_transformer(const ModelConfig& cfg, uint64_t seed, const torch::Device& device);

}   // namespace rh::models
