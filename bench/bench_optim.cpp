// Optimizer step time of PrecisionAdam in each storage mode on 10 M parameters (4 x 2.5 M), as a
// ratio to torch::optim::AdamW's step on the same parameter count (fp32, LibTorch's own). One
// thread. Prints a table; never passes or fails on time (target: every ratio <= 2).
//   usage: bench_optim [rounds=7]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/optim/precision_adam.h"

using namespace rh::optim;

namespace {

constexpr int64_t kTensors = 4, kNumel = 2'500'000;   // 10 M parameters

double ms_of(const std::function<void()>& f) {
  auto a = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Mode {
  const char* name;
  Dtype m, v;
  MasterMode master;
};

// One PrecisionAdam over bf16 model params with its main grads set (kept across steps).
struct Subject {
  std::vector<torch::Tensor> params;
  std::unique_ptr<PrecisionAdam> opt;
  Subject(const Mode& mode) {
    OptimizerConfig c;
    c.use_precision_aware_optimizer = true;
    c.exp_avg_dtype = mode.m;
    c.exp_avg_sq_dtype = mode.v;
    c.main_params_dtype = mode.master == MasterMode::fp16 ? Dtype::fp16 : Dtype::fp32;
    c.store_param_remainders = mode.master == MasterMode::remainders;
    std::vector<ParamGroup> groups = {{"decay", {}, 0.1}};
    for (int64_t i = 0; i < kTensors; ++i) {
      params.push_back(torch::randn({kNumel}).to(torch::kBFloat16));
      groups[0].params.push_back({"w" + std::to_string(i), params.back()});
    }
    opt = std::make_unique<PrecisionAdam>(groups, c);
    if (opt->master_mode() != mode.master) {
      std::fprintf(stderr, "bench_optim: mode %s did not take effect: %s\n", mode.name, opt->describe().c_str());
      std::exit(1);
    }
    for (auto& p : params) p.mutable_grad() = torch::randn({kNumel}).to(torch::kBFloat16) * 1e-2;
    opt->accumulate_grads();
  }
};

}   // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> ps;
  for (int64_t i = 0; i < kTensors; ++i) {
    ps.push_back(torch::randn({kNumel}).requires_grad_(true));
    ps.back().mutable_grad() = torch::randn({kNumel}) * 1e-2;
  }
  torch::optim::AdamW adamw(ps, torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  const Mode modes[] = {
      {"fp32 states (fp32 master)", Dtype::fp32, Dtype::fp32, MasterMode::fp32},
      {"bf16 states (fp32 master)", Dtype::bf16, Dtype::bf16, MasterMode::fp32},
      {"fp16 states (fp32 master)", Dtype::fp16, Dtype::fp16, MasterMode::fp32},
      {"fp8 states (fp32 master)", Dtype::fp8, Dtype::fp8, MasterMode::fp32},
      {"remainders, fp32 states", Dtype::fp32, Dtype::fp32, MasterMode::remainders},
      {"remainders, bf16 states", Dtype::bf16, Dtype::bf16, MasterMode::remainders},
      {"fp16 master, bf16 states", Dtype::bf16, Dtype::bf16, MasterMode::fp16},
  };
  std::vector<std::unique_ptr<Subject>> subjects;
  for (const auto& m : modes) subjects.push_back(std::make_unique<Subject>(m));
  // Warm-up (workspaces, page faults), then rounds that time AdamW and every mode back to back,
  // so each ratio compares steps taken under the same machine load.
  adamw.step();
  for (auto& s : subjects) s->opt->step(1e-4);
  std::vector<double> base;
  std::vector<std::vector<double>> ms(subjects.size()), ratio(subjects.size());
  for (int r = 0; r < rounds; ++r) {
    const double b = ms_of([&] { adamw.step(); });
    base.push_back(b);
    for (size_t i = 0; i < subjects.size(); ++i) {
      const double t = ms_of([&] { subjects[i]->opt->step(1e-4); });
      ms[i].push_back(t);
      ratio[i].push_back(t / b);
    }
  }
  std::printf("optimizer step, %lld x %lld params, 1 thread, median of %d rounds\n", static_cast<long long>(kTensors),
              static_cast<long long>(kNumel), rounds);
  std::printf("%-34s %10s %8s\n", "mode", "ms/step", "ratio");
  std::printf("%-34s %10.1f %8.2f\n", "torch::optim::AdamW (fp32)", median(base), 1.0);
  double worst = 0;
  for (size_t i = 0; i < subjects.size(); ++i) {
    const double q = median(ratio[i]);
    worst = std::max(worst, q);
    std::printf("%-34s %10.1f %8.2f\n", modes[i].name, median(ms[i]), q);
  }
  std::printf("worst ratio %.2f (target <= 2.00)\n", worst);
  return 0;
}
