// The tiny decoder-only MoE transformer behind make_moe_transformer: token embedding, L pre-norm
// blocks {RMSNorm, causal self-attention with RoPE, RMSNorm, MoE SwiGLU feed-forward}, final
// RMSNorm, untied LM head. Exposed (beyond CausalLM) so tests can read logits and internals.
// Numerics: see numerics.h. Parameter names (registration order = init order):
//   embedding.weight
//   layers.<l>.attention_norm.weight, layers.<l>.attention.qkv.weight,
//   layers.<l>.attention.proj.weight layers.<l>.moe_norm.weight, layers.<l>.moe.router.weight
//   layers.<l>.moe.experts.<e>.fc1.weight, layers.<l>.moe.experts.<e>.fc2.weight
//   (buffer, with expert bias) layers.<l>.moe.router.expert_bias
//   final_norm.weight, lm_head.weight
#pragma once
#include <torch/torch.h>

#include "models/layers.h"
#include "models/model.h"
#include "models/moe.h"

namespace rh::models {

struct TransformerBlockImpl : torch::nn::Module {
  TransformerBlockImpl(const ModelConfig& cfg, const Numerics& num, const torch::Device& device);
  // x: (B, T, C) -> (B, T, C); the layer's router output (losses, counts) goes to *routing.
  torch::Tensor forward(const torch::Tensor& x, torch::Generator* gen, RouterOutput* routing);
  double hidden_dropout;
  Numerics num;
  RMSNorm attention_norm{nullptr};
  CausalSelfAttention attention{nullptr};
  RMSNorm moe_norm{nullptr};
  MoELayer moe{nullptr};
};
TORCH_MODULE(TransformerBlock);

struct ForwardOutput {
  torch::Tensor logits;                     // (B, T, V) fp32
  torch::Tensor aux_loss;                   // () fp32, summed over layers
  std::vector<int64_t> tokens_per_expert;   // (E), summed over layers
};

class MoETransformer : public CausalLM {
 public:
  // Parameters are allocated uninitialized; call init_parameters (make_moe_transformer does).
  MoETransformer(const ModelConfig& cfg, const torch::Device& device);

  // Fills every parameter, in registration order, from one CPU generator seeded with `seed`:
  // 1-D (norm) weights ones, matrices normal(0, init_std) drawn in fp32 and rounded to the param
  // dtype. Drawing on the CPU makes the bits independent of the device.
  void init_parameters(uint64_t seed);

  // tokens: (B, T) int64 in [0, V), 1 <= T <= seq_len. gen: see CausalLM::loss.
  ForwardOutput forward(const torch::Tensor& tokens, torch::Generator* gen);
  torch::Tensor logits(const torch::Tensor& tokens, torch::Generator* gen) { return forward(tokens, gen).logits; }
  LossOutput loss(const torch::Tensor& tokens, const torch::Tensor& targets, torch::Generator* gen) override;
  std::string describe() const override;
  std::vector<ExpertBiasState> expert_bias_states() override;

  int64_t num_parameters() const;
  const ModelConfig& config() const { return cfg_; }
  const Numerics& numerics() const { return num_; }

  TokenEmbedding embedding{nullptr};
  std::vector<TransformerBlock> layers;   // the same modules as the "layers" ModuleList
  RMSNorm final_norm{nullptr};
  NoBiasLinear lm_head{nullptr};   // weight (V, C), not tied to the embedding

 private:
  void check_tokens(const torch::Tensor& tokens, const char* what) const;
  ModelConfig cfg_;
  Numerics num_;
  torch::Device device_;
};

}   // namespace rh::models
