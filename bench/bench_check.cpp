// Benchmark: wall time of one `check` (baseline + resumed process + comparisons) as a
// ratio to the bare training of N + (N-K) iterations in this process, and the wall time of whole
// matrices at -j 2 (ci.toml, and default.toml with --default), the way the tool runs them: resumed
// runs start from the pre-started worker (process/prestart.h), unless --exec. Prints figures; never
// fails on time. A matrix with a failing cell is said loudly and the benchmark exits 1. Its
// baselines train in this process, so it pins the numerics as the tool does
// (pin_cross_machine_numerics: ATen's AVX2 kernels, OpenBLAS's Haswell ones); without that, on an
// AVX-512 machine the in-process baselines and the tool's resumed runs differ in their low bits
// and the exact cells fail (8 of 51 in ci.toml before this).
//   bench_check [--exec] [--no-matrix] [--default] [SCENARIO_FILE]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "harness/cli/commands.h"
#include "harness/process/prestart.h"
#include "harness/train/env.h"
#include "harness/train/trainer.h"
#include "harness/verify/matrix.h"

namespace fs = std::filesystem;

namespace {

double matrix_seconds(const std::string& file, const fs::path& dir, size_t* n, size_t* failed) {
  rh::MatrixOptions mo;
  mo.file = file;
  mo.run_dir = dir.string();
  mo.jobs = 2;
  mo.tool = RH_TOOL;
  std::ostringstream log;
  const auto t0 = std::chrono::steady_clock::now();
  auto m = rh::run_matrix(mo, log);
  *n = m.results.size();
  *failed = 0;
  for (const auto& r : m.results) *failed += r.passed ? 0 : 1;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}   // namespace

int main(int argc, char** argv) {
  rh::pin_cross_machine_numerics(argv);   // may re-execute this benchmark
  bool exec = false, matrix = true, with_default = false;
  int rc = 0;
  std::string file = std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--exec") exec = true;
    else if (a == "--no-matrix") matrix = false;
    else if (a == "--default") with_default = true;
    else file = a;
  }
  // Before any training state, as the tool's matrix and check commands do.
  if (!exec) rh::start_prestarted_worker(&rh::tool_main);
  rh::configure_determinism(1);
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
  std::printf("resumed runs start by: %s\n",
              rh::prestarted_worker_running() ? "fork of the pre-started worker" : "exec");
  std::printf("check %s: %s\n", s.name.c_str(), r.verdict.c_str());
  std::printf("bare training of N + (N-K) = %lld iterations: %.3f s\n", static_cast<long long>(2 * N - K), bare);
  std::printf("one check (baseline + resumed + comparisons): %.3f s\n", check);
  std::printf("ratio check / bare = %.3f (target <= 1.1)\n", check / bare);
  if (matrix) {
    size_t n = 0, failed = 0;
    double t = matrix_seconds(file, work / "matrix", &n, &failed);
    std::printf("matrix %s with -j 2: %zu scenarios (%zu failed) in %.1f s (target ci.toml <= 40 s)\n", file.c_str(), n,
                failed, t);
    if (failed) std::printf("!!! %zu cells FAILED: this time is not a figure\n", failed), rc = 1;
    if (with_default) {
      const std::string def = std::string(RH_SOURCE_DIR) + "/scenarios/default.toml";
      t = matrix_seconds(def, work / "default", &n, &failed);
      std::printf("matrix %s with -j 2: %zu scenarios (%zu failed) in %.1f s (target <= 150 s)\n", def.c_str(), n,
                  failed, t);
      if (failed) std::printf("!!! %zu cells FAILED: this time is not a figure\n", failed), rc = 1;
    }
  }
  fs::remove_all(work);
  return rc;
}
