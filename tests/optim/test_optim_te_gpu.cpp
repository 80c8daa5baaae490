// Our precision-aware Adam against TransformerEngine's FusedAdam itself, on a GPU.
//
// TE compiles multi_tensor/adam.cu with --use_fast_math (transformer_engine/common/CMakeLists.txt,
// TE main d0067d0, lines 616-654): approximate division and square root, denormals flushed,
// multiply-adds contracted to FMAs. Our update rounds every op correctly (adam_step.cpp), so the
// two can differ in the last bits; this test measures by how much, and fails when any state is
// further apart than the bounds below, which follow from those instructions: the moments are
// one multiply-add each (an FMA changes at most 1 ulp), the master takes the approximate
// quotient (2 ulps: PTX div.full.f32 is within 2 ulps, sqrt.approx.f32 within 1) scaled by lr,
// so 1 ulp of the master; the bf16 weight is the master rounded (1 bf16 ulp).
//
// It needs a CUDA LibTorch build, a CUDA device and Python's transformer_engine; without them it
// is skipped (every CPU build, CI included). It has not run yet: no GPU has been lent to this
// project since it was written.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <iostream>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/optim/precision_adam.h"
#include "harness/optim/storage_codecs.h"

namespace {

using namespace rh::optim;
namespace fs = std::filesystem;

struct GpuCase {
  std::string name;
  Dtype exp_avg, exp_avg_sq;
  bool remainders;
};

void write_f32(const fs::path& p, const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * 4);
}

torch::Tensor read_raw(const fs::path& p, torch::ScalarType t, int64_t n) {
  auto out = torch::empty({n}, t);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(out.data_ptr()), n * static_cast<int64_t>(out.element_size()));
  if (!f) throw std::runtime_error("short read: " + p.string());
  return out;
}

// |a - b| in units in the last place of fp32 (ordered-integer distance); NaN vs NaN is 0.
int64_t max_ulps(const torch::Tensor& a, const torch::Tensor& b) {
  auto to_ordered = [](const torch::Tensor& x) {
    auto i = x.contiguous().view(torch::kInt).to(torch::kLong);
    return torch::where(i < 0, -(i & 0x7FFFFFFF), i);
  };
  auto d = (to_ordered(a) - to_ordered(b)).abs();
  d = torch::where(torch::isnan(a) & torch::isnan(b), torch::zeros_like(d), d);
  return d.max().item<int64_t>();
}

class TeGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(TeGpu, FusedAdamStepMatchesOurs) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: no CUDA device (or a CPU LibTorch build)";
  if (std::system("/usr/bin/env python3 -c 'import transformer_engine.pytorch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "skipped: python3 cannot import transformer_engine.pytorch";
  const auto& c = GetParam();
  const int64_t n = 5003, steps = 3;
  const double lr = 1e-3;
  const fs::path dir = fs::path(RH_BINARY_DIR) / ("te_gpu_" + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  fs::create_directories(dir / "out");

  auto gen = torch::make_generator<at::CPUGeneratorImpl>(20261206);
  auto init = (torch::randn({n}, gen) * 0.02).to(torch::kBFloat16).to(torch::kFloat);
  write_f32(dir / "in" / "param.f32", init);
  std::vector<torch::Tensor> grads;
  for (int64_t s = 0; s < steps; ++s) {   // bf16-exact, so a bf16 .grad and TE's fp32 one agree
    grads.push_back((torch::randn({n}, gen) * 1e-3).to(torch::kBFloat16).to(torch::kFloat));
    write_f32(dir / "in" / ("grad" + std::to_string(s) + ".f32"), grads.back());
  }
  OptimizerConfig cfg;
  cfg.use_precision_aware_optimizer = true;
  cfg.exp_avg_dtype = c.exp_avg;
  cfg.exp_avg_sq_dtype = c.exp_avg_sq;
  cfg.store_param_remainders = c.remainders;
  nlohmann::json js = {{"numel", n},
                       {"steps", steps},
                       {"lr", lr},
                       {"beta1", cfg.beta1},
                       {"beta2", cfg.beta2},
                       {"eps", cfg.eps},
                       {"weight_decay", cfg.weight_decay},
                       {"exp_avg", to_string(c.exp_avg)},
                       {"exp_avg_sq", to_string(c.exp_avg_sq)},
                       {"remainders", c.remainders}};
  std::ofstream(dir / "in" / "case.json") << js.dump();
  const std::string cmd = "/usr/bin/env python3 " RH_SOURCE_DIR "/tests/gpu/te_fused_adam.py " + (dir / "in").string() +
                          " " + (dir / "out").string();
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "skipped by " << cmd;
  ASSERT_EQ(rc, 0) << cmd;
  std::ifstream jf(dir / "out" / "out.json");
  const auto theirs = nlohmann::json::parse(jf);

  auto param = init.to(torch::kCUDA, torch::kBFloat16);
  std::vector<ParamGroup> groups = {{"decay", {{"w", param}}, cfg.weight_decay}};
  PrecisionAdam opt(groups, cfg);
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grads();
    param.mutable_grad() = grads[s].to(torch::kCUDA, torch::kBFloat16);
    opt.accumulate_grads();
    opt.mark_all_grads();
    opt.step(lr);
    const auto& files = theirs.at("steps").at(s);
    const std::string at = c.name + ", step " + std::to_string(s + 1);
    auto their_param = read_raw(dir / "out" / files.at("param").get<std::string>(), torch::kFloat, n);
    auto our_param = param.to(torch::kCPU, torch::kFloat).reshape({n});
    // bf16 values in fp32: one bf16 ulp is 2^16 fp32 ulps.
    EXPECT_LE(max_ulps(our_param, their_param), int64_t{1} << 16) << "param, " << at;
    for (auto key : {StateKey::exp_avg, StateKey::exp_avg_sq}) {
      auto ours = opt.get_unscaled_state("w", key).to(torch::kCPU, torch::kFloat).reshape({n});
      auto t = read_raw(dir / "out" / files.at(key_name(key)).get<std::string>(), torch::kFloat, n);
      const int64_t u = max_ulps(ours, t);
      const int64_t same = ours.view(torch::kInt).eq(t.view(torch::kInt)).sum().item<int64_t>();
      std::cout << "[ TE GPU ] " << at << " " << key_name(key) << ": " << same << "/" << n << " bit-identical, max "
                << u << " ulp\n";
      // Scaled (fp16/fp8) moments quantize after the update: a 1-ulp difference may move a code.
      EXPECT_LE(u, (c.exp_avg == Dtype::fp32 && c.exp_avg_sq == Dtype::fp32) ? 1 : 1 << 16)
          << key_name(key) << ", " << at;
    }
    auto master_theirs_file = files.at("master_param").get<std::string>();
    torch::Tensor our_master, their_master;
    if (c.remainders) {   // rebuild both fp32 masters from (bf16 weight, int16 remainder)
      auto rem = read_raw(dir / "out" / master_theirs_file, torch::kShort, n);
      their_master = codec::remainder_join(their_param.to(torch::kBFloat16), rem);
      our_master =
          codec::remainder_join(param.to(torch::kCPU).reshape({n}),
                                opt.get_unscaled_state("w", StateKey::master_param).to(torch::kCPU).reshape({n}));
    } else {
      their_master = read_raw(dir / "out" / master_theirs_file, torch::kFloat, n);
      our_master = opt.get_unscaled_state("w", StateKey::master_param).to(torch::kCPU, torch::kFloat).reshape({n});
    }
    const int64_t mu = max_ulps(our_master, their_master);
    std::cout << "[ TE GPU ] " << at << " master: max " << mu << " ulp\n";
    EXPECT_LE(mu, 1) << "master, " << at;
  }
}

INSTANTIATE_TEST_SUITE_P(States, TeGpu,
                         ::testing::Values(GpuCase{"fp32_moments", Dtype::fp32, Dtype::fp32, false},
                                           GpuCase{"bf16_moments_remainders", Dtype::bf16, Dtype::bf16, true},
                                           GpuCase{"fp16_fp8_moments_remainders", Dtype::fp8, Dtype::fp16, true}),
                         [](const auto& info) { return info.param.name; });

}   // namespace
