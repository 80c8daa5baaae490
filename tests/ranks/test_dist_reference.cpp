// The data-parallel step against an independent reference: real ranks (this binary re-executed,
// see test_dist.cpp's main) run PrecisionAdam over c10d Gloo, every rank with its own gradients,
// through what the trainer does each iteration (accumulate two micro-batches, reduce_grads,
// grad_norm, clip, count_zeros, step); tests/dp_step_reference.py computes the same steps from
// Megatron's and TransformerEngine's source with numpy (1/dp scaling, the ring reduce-scatter per
// bucket, the shard norm squared and summed, TE's Adam on each shard, the param all-gather).
// Every rank's norms, zero counts, params and owned states must equal the reference bit for bit.
// Unlike DistributedUpdate (which checks dp against one process of our own), nothing here is
// compared with our own code. dp 3 is the size where dividing by the global count and
// all-reducing differs from upstream's order.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "harness/optim/clip.h"
#include "harness/optim/precision_adam.h"
#include "harness/process/process.h"
#include "tests/rank_processes.h"
#include "harness/ranks/group.h"
#include "harness/ranks/launcher.h"
#include "tests/python_reference.h"

namespace fs = std::filesystem;
using rh::optim::Dtype;
using rh::optim::PrecisionAdam;
using rh::optim::StateKey;

int dist_reference_worker_main();   // called by test_dist.cpp's main with RH_DIST_REF_WORKER set

// A named namespace: this file shares unity translation units with test_dist.cpp, whose
// anonymous namespace has names of its own (kShapes, config_of).
namespace dist_reference {

struct RefCase {
  int world;
  Dtype main_grads;
  Dtype moments;
  bool remainders;
  int64_t bucket;   // ddp_bucket_size; 0: one bucket
};

std::string ref_case_text(const RefCase& c) {
  return "dp" + std::to_string(c.world) + "_" + rh::optim::to_string(c.main_grads) + "grads_" +
         rh::optim::to_string(c.moments) + "moments_" + (c.remainders ? "remainders" : "fp32master") + "_bucket" +
         std::to_string(c.bucket);
}

RefCase parse_ref_case(const std::string& text) {
  RefCase c{};
  c.world = std::stoi(text.substr(2));
  const auto a = text.find('_') + 1, b = text.find("grads_");
  c.main_grads = rh::optim::parse_dtype(text.substr(a, b - a), "case");
  const auto m = b + 6;
  c.moments = rh::optim::parse_dtype(text.substr(m, text.find("moments_") - m), "case");
  c.remainders = text.find("_remainders") != std::string::npos;
  c.bucket = std::stoll(text.substr(text.find("_bucket") + 7));
  return c;
}

// Model order. Sizes chosen so that params cross rank boundaries at 2 and 3 ranks, one of more
// than one 4096-element norm block.
const std::vector<std::vector<int64_t>> kShapes = {{64, 33}, {1000}, {17, 5}, {3001, 3}, {7}};
constexpr int kSteps = 3, kMicro = 2;
constexpr double kMaxNorm = 1.0;   // below the norm of some steps: the clip path runs

double lr_of(int t) { return 1e-2 * t; }

torch::Tensor initial_param(size_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + i);
  return torch::randn(kShapes[i], gen).to(torch::kBFloat16);
}

// Rank r's gradient of param i in micro-batch `micro` of step t: its own values on every rank,
// of a size that differs by rank (so the sums' order shows) and grows with t (so the clip
// leaves step 1 alone and scales the later ones).
torch::Tensor grad_of(int t, int micro, int rank, size_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000003ull * t + 1009ull * micro + 101ull * rank + i);
  return (torch::randn(kShapes[i], gen) * (0.004 * (1 + rank) * t)).to(torch::kBFloat16);
}

rh::optim::OptimizerConfig config_of(const RefCase& c) {
  rh::optim::OptimizerConfig cfg;
  cfg.use_precision_aware_optimizer = true;
  cfg.main_grads_dtype = c.main_grads;
  cfg.exp_avg_dtype = cfg.exp_avg_sq_dtype = c.moments;
  cfg.store_param_remainders = c.remainders;
  cfg.ddp_bucket_size = c.bucket;
  return cfg;
}

// What a rank writes: norms (fp32), zero counts, the params (model order), then per param
// (model order) master, exp_avg, exp_avg_sq as stored, and its shard range.
std::vector<torch::Tensor> run_rank(const RefCase& c, rh::optim::Collectives* comm) {
  torch::NoGradGuard guard;
  std::vector<rh::optim::ParamGroup> groups{{"decay", {}, 0.1}, {"no_decay", {}, 0.0}};
  std::vector<torch::Tensor> params;
  std::vector<std::string> model_order;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.push_back(initial_param(i));
    model_order.push_back("p" + std::to_string(i));
    groups[kShapes[i].size() >= 2 ? 0 : 1].params.emplace_back(model_order.back(), params.back());
  }
  PrecisionAdam opt(groups, config_of(c), comm, model_order);
  std::vector<float> norms;
  std::vector<int64_t> zeros;
  for (int t = 1; t <= kSteps; ++t) {
    for (int micro = 0; micro < kMicro; ++micro) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grad_of(t, micro, comm->rank(), i);
      opt.accumulate_grads();
    }
    opt.reduce_grads();
    const float norm = static_cast<float>(opt.grad_norm());
    norms.push_back(norm);
    const float coeff = rh::optim::clip_coefficient(norm, kMaxNorm);
    if (!(coeff == 1.0f)) opt.scale_grads(coeff);
    zeros.push_back(opt.count_zeros());
    opt.step(lr_of(t));
    opt.zero_grads();
  }
  std::vector<torch::Tensor> out{torch::tensor(norms, torch::kFloat), torch::tensor(zeros, torch::kLong)};
  for (const auto& p : params) out.push_back(p.reshape({-1}).clone());
  for (const auto& name : model_order) {
    for (auto key : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq})
      out.push_back(opt.stored(name, key).data.reshape({-1}).clone());
    const auto range = opt.shard_range(name);
    out.push_back(torch::tensor({range.first, range.second}, torch::kLong));
  }
  return out;
}

// The bit patterns of a tensor as int64 (bf16/int16: 16 bits, fp32: 32 bits, zero-extended;
// int16 remainders: their signed values, as the reference writes them).
std::vector<int64_t> patterns(const torch::Tensor& t) {
  auto c = t.contiguous();
  std::vector<int64_t> out(static_cast<size_t>(c.numel()));
  if (c.scalar_type() == torch::kBFloat16) {
    const auto* p = static_cast<const uint16_t*>(c.data_ptr());
    for (size_t k = 0; k < out.size(); ++k) out[k] = p[k];
  } else if (c.scalar_type() == torch::kFloat) {
    const auto* p = static_cast<const uint32_t*>(c.data_ptr());
    for (size_t k = 0; k < out.size(); ++k) out[k] = p[k];
  } else if (c.scalar_type() == torch::kShort) {
    const auto* p = c.data_ptr<int16_t>();
    for (size_t k = 0; k < out.size(); ++k) out[k] = p[k];
  } else {
    throw std::invalid_argument("patterns: unexpected dtype");
  }
  return out;
}

nlohmann::json reference_input(const RefCase& c) {
  const auto cfg = config_of(c);
  nlohmann::json in;
  in["world"] = c.world;
  in["shapes"] = kShapes;
  in["main_grads"] = rh::optim::to_string(c.main_grads);
  in["moments"] = rh::optim::to_string(c.moments);
  in["remainders"] = c.remainders;
  in["bucket_size"] = c.bucket;
  in["beta1"] = cfg.beta1;
  in["beta2"] = cfg.beta2;
  in["eps"] = cfg.eps;
  in["weight_decay"] = 0.1;
  in["max_norm"] = kMaxNorm;
  in["params"] = nlohmann::json::array();
  for (size_t i = 0; i < kShapes.size(); ++i) in["params"].push_back(patterns(initial_param(i)));
  in["steps"] = nlohmann::json::array();
  in["lrs"] = nlohmann::json::array();
  for (int t = 1; t <= kSteps; ++t) {
    nlohmann::json step;
    step["grads"] = nlohmann::json::array();
    for (int micro = 0; micro < kMicro; ++micro) {
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < c.world; ++r) {
        nlohmann::json per = nlohmann::json::array();
        for (size_t i = 0; i < kShapes.size(); ++i) per.push_back(patterns(grad_of(t, micro, r, i)));
        ranks.push_back(per);
      }
      step["grads"].push_back(ranks);
    }
    in["steps"].push_back(step);
    in["lrs"].push_back(lr_of(t));
  }
  return in;
}

std::vector<int> spawn_ref_ranks(const RefCase& c, const std::string& out) {
  return rh::testutil::spawn_rank_processes(
      c.world, {{"RH_DIST_REF_WORKER", "1"}, {"RH_DIST_CASE", ref_case_text(c)}, {"RH_DIST_OUT", out}});
}

// The first index where two bit-pattern lists differ, or -1.
int64_t first_difference(const std::vector<int64_t>& got, const nlohmann::json& want) {
  if (got.size() != want.size()) return static_cast<int64_t>(std::min(got.size(), want.size()));
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != want[k].get<int64_t>()) return static_cast<int64_t>(k);
  return -1;
}

class DistributedStepReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(DistributedStepReference, EveryRankEqualsTheNumpyTransliterationBitForBit) {
  const RefCase c = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("rh_test_dist_ref_" + std::to_string(::getpid()) + "_" + ref_case_text(c));
  fs::create_directories(dir);
  const std::string out = (dir / "state").string();
  const auto codes = spawn_ref_ranks(c, out);
  for (int r = 0; r < c.world; ++r) ASSERT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r << " failed";
  const auto want =
      rh::testing::python_reference_of("dp_step_reference.py", reference_input(c), (dir / "ref").string());

  int clipped = 0;
  std::string norms;
  for (const auto& bits : want["norms"]) {
    uint32_t u = bits.get<uint32_t>();
    float f;
    std::memcpy(&f, &u, sizeof f);
    clipped += rh::optim::clip_coefficient(f, kMaxNorm) < 1.0f;
    norms += " " + std::to_string(f);
  }
  EXPECT_TRUE(clipped > 0 && clipped < kSteps) << "norms" << norms << ": the case must take both paths of the clip";
  const size_t n = kShapes.size();
  const char* keys[] = {"master", "exp_avg", "exp_avg_sq"};
  for (int r = 0; r < c.world; ++r) {
    std::vector<torch::Tensor> got;
    torch::load(got, out + "." + std::to_string(r));
    ASSERT_EQ(got.size(), 2 + n + 4 * n);
    EXPECT_EQ(first_difference(patterns(got[0]), want["norms"]), -1) << "grad norms of rank " << r;
    std::vector<int64_t> zeros(got[1].data_ptr<int64_t>(), got[1].data_ptr<int64_t>() + got[1].numel());
    EXPECT_EQ(nlohmann::json(zeros), want["zeros"]) << "zero counts of rank " << r;
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(first_difference(patterns(got[2 + i]), want["params"][i]), -1) << "param p" << i << " on rank " << r;
    for (size_t i = 0; i < n; ++i) {
      const auto& ref = want["states"][static_cast<size_t>(r)][i];
      const auto range = got[2 + n + 4 * i + 3];
      EXPECT_EQ(range[0].item<int64_t>(), ref["piece"][0].get<int64_t>()) << "p" << i << " on rank " << r;
      EXPECT_EQ(range[1].item<int64_t>(), ref["piece"][1].get<int64_t>()) << "p" << i << " on rank " << r;
      for (size_t k = 0; k < 3; ++k)
        EXPECT_EQ(first_difference(patterns(got[2 + n + 4 * i + k]), ref[keys[k]]), -1)
            << keys[k] << " of p" << i << " on rank " << r;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(SizesDtypesBuckets, DistributedStepReference,
                         ::testing::Values(RefCase{2, Dtype::fp32, Dtype::bf16, true, 3000},
                                           RefCase{3, Dtype::fp32, Dtype::bf16, true, 3000},
                                           RefCase{3, Dtype::bf16, Dtype::fp32, false, 0}),
                         [](const auto& info) { return ref_case_text(info.param); });

}   // namespace dist_reference

int dist_reference_worker_main() {
  using namespace dist_reference;
  try {
    const RefCase c = parse_ref_case(std::getenv("RH_DIST_CASE"));
    rh::dist::Group group(rh::dist::placement_from_environment(), std::chrono::seconds(60));
    auto tensors = run_rank(c, &group);
    torch::save(tensors, std::string(std::getenv("RH_DIST_OUT")) + "." + std::to_string(group.rank()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reference worker: %s\n", e.what());
    return 1;
  }
}
