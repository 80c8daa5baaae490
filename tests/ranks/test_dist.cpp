// The distributed optimizer (ZeRO-1 over c10d Gloo) against a single process, with real processes:
// this binary re-executes itself as the ranks of a group (RH_DIST_WORKER set; see main() below).
// Each rank takes the same steps on the same gradients (rank 0 contributes them times dp, the
// others zeros: reduce_grads multiplies by 1/dp and sums, exactly the single-process gradient at
// the power-of-two sizes used here), writes its part of the state, and the test joins the parts
// and compares them with one process, bit for bit. The data-parallel step itself (every rank its
// own gradients, dp 3) is compared with an independent reference in test_dist_reference.cpp.
//
// Where bit-equality holds and where it does not: given the same gradients, everything here is
// elementwise or order-fixed (grad norm block sums), so fp32/bf16 states equal one process bit for
// bit, except the grad norm, which is upstream's per-shard norm squared and summed over the ranks
// (it depends on dp; test_dist_reference.cpp pins it). fp16/fp8 states are scaled per shard
// (upstream: each rank's TE FusedAdam holds only its shard), so the independent expectation for
// them is one process whose params are the shards themselves, each its own tensor (what
// upstream's per-rank FusedAdam sees); with shared_dp_scale (all-reduced amax) they equal the
// unsharded single process instead. The trainer's gradients are summed in another order at a
// different group size (upstream's ring reduce-scatter), and the grad norm depends on it; that is
// why resharded resumes in the scenarios carry a tolerance.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "harness/ranks/group.h"
#include "harness/ranks/launcher.h"
#include "harness/optim/precision_adam.h"
#include "harness/process/process.h"
#include "tests/rank_processes.h"

namespace fs = std::filesystem;
using rh::optim::Dtype;
using rh::optim::PrecisionAdam;
using rh::optim::StateKey;

namespace {

struct Case {
  Dtype moments;
  bool remainders;
  int world;
  bool shared = false;   // OptimizerConfig::shared_dp_scale
  int64_t bucket = 0;    // OptimizerConfig::ddp_bucket_size
};

std::string case_text(const Case& c) {
  return rh::optim::to_string(c.moments) + (c.remainders ? "_remainders" : "_fp32master") +
         (c.shared ? "_shared" : "_pershard") + "_bucket" + std::to_string(c.bucket) + "_dp" + std::to_string(c.world);
}

Case parse_case(const std::string& text) {
  Case parsed{};
  parsed.moments = rh::optim::parse_dtype(text.substr(0, text.find('_')), "case");
  parsed.remainders = text.find("_remainders") != std::string::npos;
  parsed.shared = text.find("_shared") != std::string::npos;
  parsed.bucket = std::stoll(text.substr(text.find("_bucket") + 7));
  parsed.world = std::stoi(text.substr(text.rfind("_dp") + 3));
  return parsed;
}

bool scaled(Dtype d) { return d == Dtype::fp16 || d == Dtype::fp8; }

// Sizes chosen so that params cross rank boundaries at 2 and 4 ranks, including one of more than
// one 4096-element norm block.
const std::vector<std::vector<int64_t>> kShapes = {{64, 33}, {1000}, {17, 5}, {3001, 3}, {7}};

struct OptRun {
  std::vector<torch::Tensor> params;
  std::unique_ptr<PrecisionAdam> opt;
  std::vector<double> norms;
};

rh::optim::OptimizerConfig config_of(const Case& test_case) {
  rh::optim::OptimizerConfig cfg;
  cfg.use_precision_aware_optimizer = true;
  cfg.exp_avg_dtype = cfg.exp_avg_sq_dtype = test_case.moments;
  cfg.store_param_remainders = test_case.remainders;
  cfg.shared_dp_scale = test_case.shared;
  cfg.ddp_bucket_size = test_case.bucket;
  return cfg;
}

// The data-parallel layout of the test's params (optimizer order: decay group, then no_decay).
rh::optim::ShardLayout layout_of(const Case& c, const std::vector<int64_t>& numels_in_opt_order) {
  return rh::optim::ShardLayout::make(numels_in_opt_order, 0, c.world, {c.bucket, false});
}

// Three steps of the same deterministic gradients; rank > 0 contributes zeros. With `pieces`
// (a single process only), every param is replaced by its pieces of the data-parallel layout,
// each its own 1-D param "p<i>.r<rank>" in the same group, with the same slices of the grads.
OptRun run_steps(const Case& test_case, rh::optim::Collectives* comm, bool pieces = false) {
  torch::NoGradGuard guard;
  OptRun run;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<rh::optim::ParamGroup> groups{{"decay", {}, 0.1}, {"no_decay", {}, 0.0}};
  std::vector<torch::Tensor> full;
  for (size_t i = 0; i < kShapes.size(); ++i) full.push_back(torch::randn(kShapes[i], gen).to(torch::kBFloat16));
  // Optimizer order, as PrecisionAdam's param_names: decay params, then no_decay.
  std::vector<size_t> opt_order;
  for (int gi = 0; gi < 2; ++gi)
    for (size_t i = 0; i < kShapes.size(); ++i)
      if ((kShapes[i].size() >= 2) == (gi == 0)) opt_order.push_back(i);
  std::vector<int64_t> numels;
  for (size_t i : opt_order) numels.push_back(full[i].numel());
  const auto layout = layout_of(test_case, numels);
  std::vector<std::pair<size_t, std::pair<int64_t, int64_t>>> slice_of;   // param -> (orig, [b, e))
  for (size_t k = 0; k < opt_order.size(); ++k) {
    const size_t i = opt_order[k];
    const size_t gi = kShapes[i].size() >= 2 ? 0 : 1;
    if (!pieces) {
      auto p = full[i];
      p.set_requires_grad(true);
      run.params.push_back(p);
      slice_of.push_back({i, {0, p.numel()}});
      groups[gi].params.emplace_back("p" + std::to_string(i), p);
      continue;
    }
    for (int rk = 0; rk < test_case.world; ++rk) {
      const auto [b, e] = layout.piece(k, rk);
      if (b == e) continue;
      auto p = full[i].reshape({-1}).narrow(0, b, e - b).clone();
      p.set_requires_grad(true);
      run.params.push_back(p);
      slice_of.push_back({i, {b, e}});
      groups[gi].params.emplace_back("p" + std::to_string(i) + ".r" + std::to_string(rk), p);
    }
  }
  run.opt = std::make_unique<PrecisionAdam>(groups, config_of(test_case), comm);
  const int rank = comm ? comm->rank() : 0;
  for (int t = 1; t <= 3; ++t) {
    auto ggen = at::make_generator<at::CPUGeneratorImpl>(100 + t);
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < kShapes.size(); ++i)
      grads.push_back((torch::randn(kShapes[i], ggen) * 0.01).to(torch::kBFloat16));
    for (size_t j = 0; j < run.params.size(); ++j) {
      auto& p = run.params[j];
      const auto& [i, be] = slice_of[j];
      auto g = grads[i].reshape({-1}).narrow(0, be.first, be.second - be.first).reshape(p.sizes()).clone();
      const int world = comm ? comm->size() : 1;   // a power of two: g * world * (1 / world) == g
      p.mutable_grad() = rank == 0 ? (g.to(torch::kFloat) * world).to(torch::kBFloat16) : torch::zeros_like(g);
    }
    run.opt->accumulate_grads();
    run.opt->reduce_grads();
    run.norms.push_back(run.opt->grad_norm());
    run.opt->scale_grads(0.5f);
    run.opt->step(1e-2 * t);
    run.opt->zero_grads();
  }
  return run;
}

// What a rank writes: norms, every param, and per param and key its owned state (+ scale).
std::vector<torch::Tensor> flatten(const OptRun& run) {
  std::vector<torch::Tensor> out{torch::tensor(run.norms, torch::kDouble)};
  for (const auto& p : run.params) out.push_back(p.detach().clone());
  for (const auto& name : run.opt->param_names())
    for (auto k : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      const auto& stored_state = run.opt->stored(name, k);
      out.push_back(stored_state.data.reshape({-1}).clone());
      out.push_back(torch::tensor({stored_state.scale.value_or(-1.0f)}, torch::kFloat));
    }
  return out;
}

int worker_main() {
  try {
    const Case test_case = parse_case(std::getenv("RH_DIST_CASE"));
    rh::dist::Group group(rh::dist::placement_from_environment(), std::chrono::seconds(60));
    OptRun run = run_steps(test_case, &group);
    auto tensors = flatten(run);
    torch::save(tensors, std::string(std::getenv("RH_DIST_OUT")) + "." + std::to_string(group.rank()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker: %s\n", e.what());
    return 1;
  }
}

// Starts `world` copies of this binary as ranks; returns their exit codes (-1 on a timeout).
std::vector<int> spawn_ranks(const Case& test_case, const std::string& out) {
  return rh::testutil::spawn_rank_processes(
      test_case.world, {{"RH_DIST_WORKER", "1"}, {"RH_DIST_CASE", case_text(test_case)}, {"RH_DIST_OUT", out}});
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel()) return false;
  auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel() * x.element_size())) == 0;
}

class DistributedUpdate : public ::testing::TestWithParam<Case> {};

TEST_P(DistributedUpdate, EqualsOneProcessBitForBit) {
  const Case test_case = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("rh_test_dist_" + std::to_string(::getpid()) + "_" + case_text(test_case));
  fs::create_directories(dir);
  const std::string out = (dir / "state").string();
  const auto codes = spawn_ranks(test_case, out);
  for (int r = 0; r < test_case.world; ++r) ASSERT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r << " failed";

  OptRun single = run_steps(test_case, nullptr);
  const auto want = flatten(single);
  std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(test_case.world));
  for (int r = 0; r < test_case.world; ++r) torch::load(got[static_cast<size_t>(r)], out + "." + std::to_string(r));
  const size_t param_count = kShapes.size();
  const bool like_single = test_case.shared || !scaled(test_case.moments);
  for (int r = 0; r < test_case.world; ++r) {
    const auto& rank_state = got[static_cast<size_t>(r)];
    ASSERT_EQ(rank_state.size(), want.size());
    // Every rank has the group's norm; it is not the single process's (per-shard norms squared
    // and summed), but close: 1e-6 relative is some ten fp32 roundings of a sum of squares.
    EXPECT_TRUE(same_bits(rank_state[0], got[0][0])) << "grad norms of rank " << r << " and rank 0";
    for (int64_t t = 0; t < want[0].numel(); ++t)
      EXPECT_NEAR(rank_state[0][t].item<double>(), want[0][t].item<double>(), 1e-6 * want[0][t].item<double>())
          << "grad norm " << t << " of rank " << r;
    if (like_single) {   // per-shard scaled states: params checked against the pieces below
      for (size_t i = 0; i < param_count; ++i)
        EXPECT_TRUE(same_bits(rank_state[1 + i], want[1 + i])) << "param " << i << " on rank " << r;
    }
  }
  // Joined in rank order, the owned parts are the single process's state (fp32/bf16, or shared
  // scales). (States are written in optimizer order: group, then param.)
  auto layout = [&] {
    std::vector<int64_t> numels;
    for (const auto& name : single.opt->param_names())
      numels.push_back(single.opt->param(name).numel());   // optimizer order
    return layout_of(test_case, numels);
  }();
  EXPECT_FALSE(layout.split_params().empty()) << "the case must split a param across ranks";
  for (size_t i = 0; i < param_count; ++i)
    for (size_t k = 0; k < 3; ++k) {
      const size_t idx = 1 + param_count + 2 * (3 * i + k);
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < test_case.world; ++r) {
        const auto& rank_state = got[static_cast<size_t>(r)];
        if (rank_state[idx].numel() > 0) {
          parts.push_back(rank_state[idx]);
          if (like_single) {
            EXPECT_TRUE(same_bits(rank_state[idx + 1], want[idx + 1]))
                << "scale of p" << i << " key " << k << " on rank " << r;
          }
        }
        const auto piece_range = layout.piece(i, r);
        EXPECT_EQ(rank_state[idx].numel(), piece_range.second - piece_range.first) << "p" << i << " on rank " << r;
      }
      if (like_single) {
        EXPECT_TRUE(same_bits(torch::cat(parts), want[idx])) << "state of p" << i << " key " << k;
      }
    }
  if (!like_single) {
    // Per shard: rank r's state of param i (and its scale) is what one process holding only the
    // pieces as params has for piece (i, r); the model params are those pieces joined.
    const OptRun pieces = run_steps(test_case, nullptr, /*pieces=*/true);
    const auto names = single.opt->param_names();
    bool some_scale_differs = false;
    for (size_t i = 0; i < param_count; ++i) {
      for (int r = 0; r < test_case.world; ++r) {
        const auto& rank_state = got[static_cast<size_t>(r)];
        if (layout.piece(i, r).first == layout.piece(i, r).second) continue;
        const std::string piece = names[i] + ".r" + std::to_string(r);
        for (size_t k = 0; k < 3; ++k) {
          const size_t idx = 1 + param_count + 2 * (3 * i + k);
          const auto& stored_state = pieces.opt->stored(piece, static_cast<StateKey>(k));
          EXPECT_TRUE(same_bits(rank_state[idx], stored_state.data.reshape({-1})))
              << "state of " << piece << " key " << k;
          EXPECT_TRUE(
              same_bits(rank_state[idx + 1], torch::tensor({stored_state.scale.value_or(-1.0f)}, torch::kFloat)))
              << "scale of " << piece << " key " << k;
          some_scale_differs = some_scale_differs || !same_bits(rank_state[idx + 1], want[idx + 1]);
        }
      }
    }
    EXPECT_TRUE(some_scale_differs) << "per-shard scales all equal the whole tensors': the case shows nothing";
    for (size_t i = 0; i < param_count; ++i) {
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < test_case.world; ++r)
        if (layout.piece(i, r).first != layout.piece(i, r).second)
          parts.push_back(pieces.opt->param(names[i] + ".r" + std::to_string(r)).detach().reshape({-1}));
      // flatten() writes the params in optimizer order, as names.
      EXPECT_TRUE(same_bits(got[0][1 + i].reshape({-1}), torch::cat(parts))) << "param " << names[i];
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(MomentsMastersSizes, DistributedUpdate,
                         ::testing::Values(Case{Dtype::fp32, false, 2}, Case{Dtype::bf16, true, 2},
                                           Case{Dtype::fp16, false, 2}, Case{Dtype::fp8, true, 2},
                                           Case{Dtype::bf16, false, 4}, Case{Dtype::fp16, true, 4},
                                           Case{Dtype::fp8, false, 4}, Case{Dtype::fp16, false, 2, true},
                                           Case{Dtype::fp8, true, 4, true}, Case{Dtype::fp8, false, 2, false, 2000},
                                           Case{Dtype::bf16, true, 4, false, 3000}),
                         [](const auto& info) { return case_text(info.param); });

TEST(Placement, ReadsTorchrunAndSlurmVariables) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                        "SLURM_NTASKS", "SLURM_LOCALID"})
    unsetenv(v);
  EXPECT_EQ(rh::dist::placement_from_environment().world_size, 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29555", 1);
  auto placement = rh::dist::placement_from_environment();
  EXPECT_EQ(placement.world_size, 4);
  EXPECT_EQ(placement.rank, 3);
  EXPECT_EQ(placement.local_rank, 1);
  EXPECT_EQ(placement.master_addr, "node7");
  EXPECT_EQ(placement.master_port, 29555);
  setenv("WORLD_SIZE", "2", 1);   // torchrun's variables win over SLURM's
  setenv("RANK", "1", 1);
  placement = rh::dist::placement_from_environment();
  EXPECT_EQ(placement.world_size, 2);
  EXPECT_EQ(placement.rank, 1);
  setenv("RANK", "2", 1);   // outside [0, WORLD_SIZE)
  try {
    rh::dist::placement_from_environment();
    ADD_FAILURE() << "RANK=2 with WORLD_SIZE=2 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='2'"), std::string::npos) << e.what();
  }
  unsetenv("MASTER_PORT");
  setenv("RANK", "1", 1);
  EXPECT_THROW(rh::dist::placement_from_environment(), std::invalid_argument);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"})
    unsetenv(v);
}

}   // namespace

int dist_reference_worker_main();   // tests/ranks/test_dist_reference.cpp

int main(int argc, char** argv) {
  if (std::getenv("RH_DIST_WORKER")) return worker_main();
  if (std::getenv("RH_DIST_REF_WORKER")) return dist_reference_worker_main();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
