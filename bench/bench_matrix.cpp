// Benchmark: what a matrix run costs beside the training it does. Runs the tool as CI does
// (`resume-harness matrix FILE -j J --run-dir D`, report included; ci.toml against its goldens),
// then reads the phases.json every process, cell and the matrix wrote, and prints:
//  - the wall time and three training floors: iterations x ranks trained, times the default
//    config's per-iteration time measured here alone (the floor) and with J copies training
//    at once in J processes (what J workers sharing this machine can reach), divided by J; and the
//    matrix's own training seconds x ranks / J;
//  - the ratio wall / floor for each;
//  - a breakdown of the workers' time (J x wall: every row is worker-seconds, so the rows add up
//    to the wall and "unaccounted" is ~0): training, process set-up, loads, saves and state dumps
//    (fsync inside them), fingerprints, job outputs, process start and exit, the checks' phases,
//    idle workers, summaries, tool start and report. Ranks 1.. of a data-parallel process run
//    beside its rank 0 on cores the other workers share; their core-seconds are printed apart.
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

#include "harness/process/process.h"
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

// Seconds per iteration when `jobs` copies of that run train at the same time, each in its own
// process (this executable with --iteration-time): what a matrix at -j J can reach at best, since
// its J workers train side by side and share the machine's caches and memory bandwidth.
double concurrent_per_iteration_seconds(int jobs, const std::string& self) {
  std::vector<rh::ChildSpec> children;
  std::vector<fs::path> logs;
  for (int i = 0; i < jobs; ++i) {
    logs.push_back(fs::temp_directory_path() / ("rh_bench_matrix_iter_" + std::to_string(i) + ".log"));
    fs::remove(logs.back());
    rh::ChildSpec c;
    c.argv = {self, "--iteration-time"};
    c.log_path = logs.back().string();
    children.push_back(c);
  }
  const auto exits = rh::run_children(children, 600);
  double worst = 0;
  for (size_t i = 0; i < exits.size(); ++i) {
    const std::string out = rh::tail_of_file(logs[i].string(), 200);
    const auto at = out.rfind("seconds per iteration: ");
    if (!exits[i].ok() || at == std::string::npos)
      throw std::runtime_error("concurrent timing run " + std::to_string(i) + " " + exits[i].describe() + ": " + out);
    worst = std::max(worst, std::stod(out.substr(at + 23)));
  }
  return worst;
}

// Worker-seconds (the matrix's workers: busy + idle = J x its wall) by breakdown row. A process
// is counted by its rank 0's phases, which are wall seconds of the worker that waits for it; the
// other ranks of a data-parallel process run beside it on cores the other workers also use, so
// their seconds are not worker-seconds: they are tallied apart (extra_rank_core).
struct Tally {
  std::map<std::string, double> worker;
  double iterations_x_ranks = 0;
  double train_core = 0;        // training seconds x ranks
  double extra_rank_core = 0;   // core-seconds of ranks 1.. of data-parallel processes
  int processes = 0;
};

// One training process's phases.json (rank 0's; `ranks` ran alike). Returns its total seconds.
double add_process(Tally& t, const nlohmann::json& p) {
  const double ranks = std::max(1.0, num(p, "ranks"));
  const auto& s = p.contains("seconds") ? p.at("seconds") : nlohmann::json::object();
  t.iterations_x_ranks += num(p, "iterations") * ranks;
  t.train_core += num(s, "train") * ranks;
  const double fsync_s = num(p, "fsync");
  t.worker["training iterations"] += num(s, "train");
  t.worker["process set-up (model, optimizer, group)"] += num(s, "setup");
  t.worker["checkpoint loads"] += num(s, "load");
  t.worker["saves and state dumps, less fsync"] += num(s, "save") + num(s, "dump") - fsync_s;
  t.worker["fsync (in saves and dumps)"] += fsync_s;
  t.worker["fingerprints"] += num(s, "fingerprint");
  t.worker["job outputs (metrics, fingerprints)"] += num(s, "outputs");
  t.extra_rank_core += (ranks - 1) * num(p, "total");
  ++t.processes;
  return num(p, "total");
}

}   // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  int jobs = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iteration-time") {   // a child of concurrent_per_iteration_seconds
      rh::pin_cross_machine_numerics(argv);
      rh::configure_determinism(1);
      std::printf("seconds per iteration: %.6f\n", per_iteration_seconds());
      return 0;
    }
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
  const double t_iter_j = concurrent_per_iteration_seconds(jobs, rh::self_executable());
  std::printf("default config, %d copies at once (one process each): %.4f s per iteration (%.2fx)\n", jobs, t_iter_j,
              t_iter_j / t_iter);
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
    // Baselines: their processes' phases; the rest of their worker time is process start/exit (a
    // data-parallel baseline is a child `train --nproc`), pruning and the plan's bookkeeping.
    double baseline_totals = 0;
    for (const auto& e : fs::directory_iterator(dir / "baselines")) {
      const auto p = read_json(e.path() / "phases.json");
      if (p.is_object()) baseline_totals += add_process(t, p);
    }
    t.worker["process start/exit, baseline bookkeeping"] += num(workers, "baselines") - baseline_totals;
    // Cells: the resumed process (its phases) inside the check's phases; what the cell's worker
    // spent outside the check's phases is its set-up (config, plan) and the cell's bookkeeping.
    double resumed_walls = 0, resumed_totals = 0, check_phases = 0;
    for (const auto& e : fs::directory_iterator(dir / "scenarios")) {
      const auto c = read_json(e.path() / "phases.json");
      if (!c.is_object()) continue;
      const auto& s = c.at("seconds");
      for (const auto& [k, v] : s.items())
        if (v.is_number()) check_phases += v.get<double>();
      resumed_walls += num(s, "resumed_process");
      t.worker["checks: copy baseline metrics"] += num(s, "copy_baseline");
      t.worker["checks: measure and compare states/metrics"] += num(s, "compare");
      t.worker["checks: cleanup"] += num(s, "cleanup");
      t.worker["checks: write results"] += num(s, "write_results");
      const auto p = read_json(e.path() / "resumed" / "phases.json");
      if (p.is_object()) resumed_totals += add_process(t, p);
    }
    t.worker["process start/exit (resumed runs)"] += resumed_walls - resumed_totals;
    t.worker["cells outside their checks' phases"] += num(workers, "cells") - check_phases;
    t.worker["external-trainer cells"] += num(workers, "external_cells");
    t.worker["workers idle (waiting for a baseline, or the tail)"] += num(workers, "idle");
    t.worker["summaries"] += num(mphases, "summaries") * J;   // one thread, the others done
    t.worker["tool start, planning, report (outside the matrix)"] += (tool_wall - wall) * J;
    double accounted = 0;
    for (const auto& [k, v] : t.worker) accounted += v;
    const double unaccounted = tool_wall * J - accounted;   // J x wall less every row: ~0 by construction

    const double floor_iter = t.iterations_x_ranks * t_iter / J;
    const double floor_iter_j = t.iterations_x_ranks * t_iter_j / J;
    std::printf("\n%s with -j %d: %.0f cells, %d training processes, %.0f iterations x ranks\n", file.c_str(), jobs,
                num(summary, "total"), t.processes, t.iterations_x_ranks);
    std::printf("wall time (tool, report included): %.1f s; matrix alone %.1f s\n", tool_wall, wall);
    std::printf("training floor, iterations x ranks x %.4f s (alone) / %d: %.1f s -> ratio %.2f (target <= 1.25)\n",
                t_iter, jobs, floor_iter, tool_wall / floor_iter);
    std::printf("training floor, iterations x ranks x %.4f s (%d at once) / %d: %.1f s -> ratio %.2f\n", t_iter_j, jobs,
                jobs, floor_iter_j, tool_wall / floor_iter_j);
    std::printf("training floor, the matrix's own training seconds x ranks / %d: %.1f s -> ratio %.2f\n", jobs,
                t.train_core / J, tool_wall / (t.train_core / J));
    std::printf("breakdown of the %d workers' time (wall-seconds = worker-seconds / %d; rows sum to the wall):\n", jobs,
                jobs);
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [k, v] : t.worker) rows.emplace_back(v, k);
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [v, k] : rows)
      std::printf("  %8.1f s  %5.1f %%  %s\n", v / J, 100.0 * v / (tool_wall * J), k.c_str());
    std::printf("  %8.1f s  %5.1f %%  unaccounted\n", unaccounted / J, 100.0 * unaccounted / (tool_wall * J));
    std::printf(
        "not in the workers' time: ranks 1.. of data-parallel processes, %.1f core-seconds (%.1f s at %d cores)\n",
        t.extra_rank_core, t.extra_rank_core / J, jobs);
    fs::remove_all(dir);
  }
  return rc;
}
