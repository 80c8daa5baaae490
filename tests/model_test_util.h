// Shared helpers for the models/ tests (test_model*.cpp): the numerics cases every parameterized
// suite runs over, small configs, and bitwise comparison helpers.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include "models/moe_transformer.h"

namespace rh::models::testing {

struct NumericsCase {
  std::string name;          // test-name suffix
  std::string param_dtype;   // ModelConfig.param_dtype
  std::string compute;       // ModelConfig.compute
};

inline void PrintTo(const NumericsCase& c, std::ostream* os) {
  *os << "param_dtype=" << c.param_dtype << " compute=" << c.compute;
}

inline std::vector<NumericsCase> numerics_cases() {
  return {{"fp32", "fp32", "fp32"}, {"bf16_fp32compute", "bf16", "fp32"}, {"bf16_native", "bf16", "native"}};
}

inline std::string case_name(const ::testing::TestParamInfo<NumericsCase>& info) { return info.param.name; }

inline ModelConfig config_for(const NumericsCase& c) {
  ModelConfig cfg;   // the default ~1M-parameter model: fast enough on one thread
  cfg.param_dtype = c.param_dtype;
  cfg.compute = c.compute;
  return cfg;
}

inline std::shared_ptr<MoETransformer> build(const ModelConfig& cfg, uint64_t seed) {
  auto m = std::dynamic_pointer_cast<MoETransformer>(make_moe_transformer(cfg, seed, torch::kCPU));
  EXPECT_NE(m, nullptr);
  return m;
}

inline torch::Generator cpu_gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

inline torch::Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  auto g = cpu_gen(seed);
  return torch::randint(0, V, {B, T}, g);
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Bitwise equality: same dtype, shape and bytes (so -0 != +0 and NaN patterns must agree).
inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ac = a.detach().contiguous().cpu(), bc = b.detach().contiguous().cpu();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

}   // namespace rh::models::testing
