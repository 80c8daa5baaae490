// The harness's overhead on an external-trainer cell: everything a check does besides the
// trainer's own runs (starting them, reading their logs and probe records, copying save
// directories, comparing and converting checkpoints, writing results), as a ratio to the time
// the trainer's runs took. Target: under 10 %.
//
//   bench_external [SCENARIO_FILE [FILTER [REPEATS]]]
//   default: scenarios/external.toml, the cells "tiny-lm/" (correct trainer, every level), 3 repeats
// Prints one line per cell (median over repeats) and the total. Exits 1 when a cell did not meet
// its expectation: a failing run's time is not a figure.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "bench/bench_util.h"
#include "harness/verify/check.h"
#include "harness/verify/scenario.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const std::string file = argc > 1 ? argv[1] : RH_SOURCE_DIR "/scenarios/external.toml";
  const std::string filter = argc > 2 ? argv[2] : "tiny-lm/";
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  const auto cells = rh::select_scenarios(rh::load_scenarios(file), filter);
  const fs::path work = fs::temp_directory_path() / ("rh_bench_external_" + std::to_string(::getpid()));
  double total_trainer = 0, total_all = 0;
  bool failed = false;
  std::printf("%-60s %10s %10s %9s\n", "cell", "trainer s", "total s", "overhead");
  for (const auto& s : cells) {
    std::vector<double> trainer, all;
    for (int i = 0; i < repeats; ++i) {
      rh::CheckOptions o;
      o.tool = RH_TOOL;
      o.work_dir = (work / "cell").string();
      const auto r = rh::run_check(s, o);
      if (!r.passed) {
        std::fprintf(stderr, "FAILED: %s: %s\n", s.name.c_str(), r.verdict.c_str());
        failed = true;
      }
      trainer.push_back(r.trainer_seconds);
      all.push_back(r.seconds);
    }
    const double t = rh_bench::median(trainer), a = rh_bench::median(all);
    total_trainer += t;
    total_all += a;
    std::printf("%-60s %10.3f %10.3f %8.1f%%\n", s.name.c_str(), t, a, 100.0 * (a - t) / t);
  }
  fs::remove_all(work);
  std::printf("%-60s %10.3f %10.3f %8.1f%%\n", "all", total_trainer, total_all,
              100.0 * (total_all - total_trainer) / total_trainer);
  if (failed) {
    std::fprintf(stderr, "bench_external: some cells FAILED; the figures above are not valid\n");
    return 1;
  }
  return 0;
}
