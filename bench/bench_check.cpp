// Benchmark (issue 5): wall time of one `check` (baseline + resumed processes + comparisons) as a
// ratio to the bare training time of N + (N-K) iterations in-process, and the wall time of the
// whole ci.toml matrix at -j 2. Prints figures; never fails on time.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "harness/env.h"
#include "harness/matrix.h"
#include "harness/trainer.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  rh::configure_determinism(1);
  const std::string file = argc > 1 ? argv[1] : std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  const bool skip_matrix = argc > 2 && std::string(argv[2]) == "--no-matrix";
  auto all = rh::load_scenarios(file);
  auto sel = rh::select_scenarios(all, "seed-protocol");
  if (sel.empty()) {
    std::cerr << "no seed-protocol scenario in " << file << "\n";
    return 2;
  }
  const auto& s = sel.front();
  const int64_t N = s.cfg.train.iterations, K = s.save_at;
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };

  auto t0 = now();
  {
    rh::Trainer a(s.cfg);
    for (int64_t i = 0; i < N; ++i) a.train_iteration();
    rh::Trainer b(s.cfg);
    for (int64_t i = 0; i < N - K; ++i) b.train_iteration();
  }
  const double bare = secs(t0, now());

  const auto work = fs::temp_directory_path() / "rh_bench_check";
  rh::CheckOptions o;
  o.tool = RH_TOOL;
  o.work_dir = (work / "one").string();
  t0 = now();
  auto r = rh::run_check(s, o);
  const double check = secs(t0, now());
  std::printf("%s\n", rh::describe(rh::runtime_info()).c_str());
  std::printf("check %s: %s\n", s.name.c_str(), r.verdict.c_str());
  std::printf("bare training of N + (N-K) = %lld iterations: %.3f s\n", static_cast<long long>(2 * N - K), bare);
  std::printf("one check (baseline + resumed + comparisons): %.3f s\n", check);
  std::printf("ratio check / bare = %.3f (target <= 1.3)\n", check / bare);
  if (!skip_matrix) {
    rh::MatrixOptions mo;
    mo.file = file;
    mo.run_dir = (work / "matrix").string();
    mo.jobs = 2;
    mo.tool = RH_TOOL;
    std::ostringstream log;
    t0 = now();
    auto m = rh::run_matrix(mo, log);
    std::printf("matrix %s with -j 2: %zu scenarios in %.1f s (exit %d)\n", file.c_str(), m.results.size(),
                secs(t0, now()), m.exit_code);
  }
  fs::remove_all(work);
  return 0;
}
