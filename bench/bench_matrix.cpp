// Benchmark: what a matrix run costs beside the training it does (issue 33). Runs the tool as CI
// does (`resume-harness matrix FILE -j J --run-dir D`, report included; ci.toml against its
// goldens), then reads the phases.json every process, cell and the matrix wrote, and prints:
//  - the wall time, and the training floor two ways: the iterations x ranks it trained times the
//    per-iteration time of the default config measured here on its own (the floor), and
//    the seconds its processes spent in training iterations (train phases x ranks) / J;
//  - the ratio wall / floor;
//  - a breakdown in wall-seconds (core-seconds / J): training, process set-up, loads, saves and
//    state dumps (fsync inside them), fingerprints, job outputs, process start and exit, the
//    checks' comparisons and writes, workers idle, summaries, the report, the rest.
// A run with a failing cell is said loudly and the benchmark exits 1: its time is not a figure.
//   bench_matrix [--default] [-j J] [FILE...]     (default: scenarios/ci.toml)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/dist/process.h"
#include "harness/train/env.h"
#include "harness/train/trainer.h"

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return nlohmann::json();
  return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
}

double num(const nlohmann::json& j, const std::string& k) {
  return j.is_object() && j.contains(k) && j.at(k).is_number() ? j.at(k).get<double>() : 0.0;
}

// Seconds per training iteration of the default config, on its own (best of 2 runs of 20).
double per_iteration_seconds() {
  rh::RunConfig cfg;
  cfg.optim.use_precision_aware_optimizer = true;
  cfg.optim.exp_avg_dtype = rh::optim::Dtype::bf16;
  cfg.optim.exp_avg_sq_dtype = rh::optim::Dtype::bf16;
  double best = 1e30;
  for (int r = 0; r < 2; ++r) {
    rh::Trainer t(cfg);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < cfg.train.iterations; ++i) t.train_iteration();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / static_cast<double>(cfg.train.iterations);
}

struct Tally {
  std::map<std::string, double> core;   // core-seconds by breakdown row
  double iterations_x_ranks = 0;
  double train_core = 0;
  int processes = 0;
};

// One training process's phases.json (rank 0's; `ranks` ran alike).
void add_process(Tally& t, const nlohmann::json& p, double* total_out) {
  const double ranks = std::max(1.0, num(p, "ranks"));
  const auto& s = p.contains("seconds") ? p.at("seconds") : nlohmann::json::object();
  t.iterations_x_ranks += num(p, "iterations") * ranks;
  t.train_core += num(s, "train") * ranks;
  const double fs_ = num(p, "fsync") * ranks;
  t.core["training iterations"] += num(s, "train") * ranks;
  t.core["process set-up (model, optimizer, group)"] += num(s, "setup") * ranks;
  t.core["checkpoint loads"] += num(s, "load") * ranks;
  t.core["saves and state dumps, less fsync"] += (num(s, "save") + num(s, "dump")) * ranks - fs_;
  t.core["fsync (in saves and dumps)"] += fs_;
  t.core["fingerprints"] += num(s, "fingerprint") * ranks;
  t.core["job outputs (metrics, fingerprints)"] += num(s, "outputs") * ranks;
  ++t.processes;
  *total_out = num(p, "total");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  int jobs = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--default") files.push_back(std::string(RH_SOURCE_DIR) + "/scenarios/default.toml");
    else if (a == "-j" && i + 1 < argc) jobs = std::atoi(argv[++i]);
    else files.push_back(a);
  }
  if (files.empty()) files.push_back(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  rh::pin_cross_machine_numerics(argv);   // the per-iteration time with the tool's kernels
  rh::configure_determinism(1);
  std::printf("%s\n", rh::describe(rh::runtime_info()).c_str());
  const double t_iter = per_iteration_seconds();
  std::printf("default config on its own: %.4f s per iteration\n", t_iter);
  int rc = 0;
  for (const auto& file : files) {
    const fs::path dir = fs::temp_directory_path() / ("rh_bench_matrix_" + fs::path(file).stem().string());
    fs::remove_all(dir);
    std::vector<std::string> argv_tool{RH_TOOL, "matrix", file, "-j", std::to_string(jobs), "--run-dir", dir.string()};
    if (fs::path(file).filename() == "ci.toml")
      argv_tool.insert(argv_tool.end(), {"--golden", std::string(RH_SOURCE_DIR) + "/scenarios/golden/ci"});
    const fs::path log = fs::temp_directory_path() / "rh_bench_matrix.log";
    const auto t0 = std::chrono::steady_clock::now();
    const auto ex = rh::run_process(argv_tool, log.string(), 3600);
    const double tool_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto summary = read_json(dir / "summary.json");
    const auto mphases = read_json(dir / "phases.json");
    const double failed = num(summary, "failed");
    if (ex.exit_code != 0 || failed > 0 || !mphases.is_object()) {
      std::printf("\n!!! %s: the matrix FAILED (exit %d, %.0f failed cells): its time is not a figure. Log: %s\n",
                  file.c_str(), ex.exit_code, failed, log.c_str());
      std::printf("%s\n", rh::tail_of_file(log.string(), 3000).c_str());
      rc = 1;
      continue;
    }
    Tally t;
    const double wall = num(mphases, "wall");
    const double J = std::max(1.0, num(mphases, "jobs"));
    const auto& workers = mphases.at("workers");
    // Baselines: their own phases; the rest of their task time is process start/exit (a
    // data-parallel baseline is a child `train --nproc`), pruning and the plan's bookkeeping.
    double baseline_totals = 0;
    for (const auto& e : fs::directory_iterator(dir / "baselines")) {
      double total = 0;
      const auto p = read_json(e.path() / "phases.json");
      if (!p.is_object()) continue;
      add_process(t, p, &total);
      baseline_totals += total;
    }
    t.core["process start/exit, baseline bookkeeping"] += num(workers, "baselines") - baseline_totals;
    // Cells: the resumed process (its phases) inside the check's phases.
    double resumed_walls = 0, resumed_totals = 0;
    for (const auto& e : fs::directory_iterator(dir / "scenarios")) {
      const auto c = read_json(e.path() / "phases.json");
      if (!c.is_object()) continue;
      const auto& s = c.at("seconds");
      resumed_walls += num(s, "resumed_process");
      t.core["checks: copy baseline metrics"] += num(s, "copy_baseline");
      t.core["checks: measure and compare states/metrics"] += num(s, "compare");
      t.core["checks: cleanup"] += num(s, "cleanup");
      t.core["checks: write results"] += num(s, "write_results");
      double total = 0;
      const auto p = read_json(e.path() / "resumed" / "phases.json");
      if (p.is_object()) {
        add_process(t, p, &total);
        resumed_totals += total;
      }
    }
    t.core["process start/exit (resumed runs)"] += resumed_walls - resumed_totals;
    t.core["external-trainer cells"] += num(workers, "external_cells");
    t.core["workers idle (waiting for a baseline, or the tail)"] += num(workers, "idle");
    t.core["summaries"] += num(mphases, "summaries") * J;   // one thread, the others done
    t.core["report (after the matrix)"] += (tool_wall - wall) * J;
    double accounted = 0;
    for (const auto& [k, v] : t.core) accounted += v;
    t.core["the rest (tool start, planning, unaccounted)"] += tool_wall * J - accounted;

    const double floor_iter = t.iterations_x_ranks * t_iter / J;
    const double floor_measured = t.train_core / J;
    std::printf("\n%s with -j %d: %.0f cells, %d training processes, %.0f iterations x ranks\n", file.c_str(), jobs,
                num(summary, "total"), t.processes, t.iterations_x_ranks);
    std::printf("wall time (tool, report included): %.1f s; matrix alone %.1f s\n", tool_wall, wall);
    std::printf("training floor, iterations x ranks x %.4f s / %d: %.1f s -> ratio %.2f (target <= 1.25)\n", t_iter,
                jobs, floor_iter, tool_wall / floor_iter);
    std::printf("training floor, measured training iterations / %d: %.1f s -> ratio %.2f\n", jobs, floor_measured,
                tool_wall / floor_measured);
    std::printf("breakdown (wall-seconds = core-seconds / %d):\n", jobs);
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [k, v] : t.core) rows.emplace_back(v, k);
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [v, k] : rows) std::printf("  %8.1f s  %5.1f %%  %s\n", v / J, 100.0 * v / (tool_wall * J), k.c_str());
    fs::remove_all(dir);
  }
  return rc;
}
