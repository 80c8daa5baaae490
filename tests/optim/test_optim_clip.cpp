// Global-norm clipping's coefficient (harness/optim/clip.h) against an independent numpy
// computation of Megatron's rule (tests/megatron_reference.py, run by this test with Debian's
// /usr/bin/python3): megatron/core/optimizer/clip_grads.py clip_grad_by_total_norm_fp32,
// NVIDIA/Megatron-LM main d98e8a6 lines 179-191.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/python_reference.h"
#include "harness/optim/clip.h"

namespace {

const nlohmann::json& clip_reference() {
  return rh::testing::python_reference("megatron_reference.py", "megatron_reference_clip.json");
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Clip, CoefficientMatchesMegatronsFp32RuleBitForBit) {
  size_t n = 0;
  for (const auto& c : clip_reference().at("clip")) {
    const float norm = from_bits(c.at("norm_bits").get<uint32_t>());
    const double max_norm = c.at("max_norm");
    const float got = rh::optim::clip_coefficient(norm, max_norm);
    EXPECT_EQ(bits(got), c.at("coeff_bits").get<uint32_t>())
        << "norm " << norm << " max_norm " << max_norm << ": got " << got << ", numpy "
        << from_bits(c.at("coeff_bits").get<uint32_t>());
    ++n;
  }
  EXPECT_GT(n, 60u);
}

// What differs from the rule this tool had before (scale when norm > max_norm, coefficient in
// double): a norm equal to max_norm, or just below it within 1e-6, is scaled; a NaN norm makes
// every grad NaN (torch's clamp_max keeps NaN); an infinite one zeroes them.
TEST(Clip, ScalesAtTheThresholdAndPropagatesNaN) {
  EXPECT_LT(rh::optim::clip_coefficient(1.0f, 1.0), 1.0f);
  EXPECT_LT(rh::optim::clip_coefficient(std::nextafter(1.0f, 0.0f), 1.0), 1.0f);
  EXPECT_EQ(rh::optim::clip_coefficient(0.999f, 1.0), 1.0f);
  EXPECT_TRUE(std::isnan(rh::optim::clip_coefficient(std::numeric_limits<float>::quiet_NaN(), 1.0)));
  EXPECT_EQ(rh::optim::clip_coefficient(std::numeric_limits<float>::infinity(), 1.0), 0.0f);
}

}   // namespace
