// Shared baselines; see baseline.h.
#include "harness/verify/baseline.h"

#include <map>

#include "harness/base/no_follow.h"
#include "harness/base/text.h"
#include "harness/process/process.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

// Two cells share a checkpoint when their policies print alike.
std::string policy_key(const ckpt::SavePolicy& p) { return ckpt::to_json(p).dump(); }

std::string run_key(const RunConfig& cfg, int64_t dp_size) {
  return to_json(cfg).dump() + "|dp=" + std::to_string(dp_size);
}

}   // namespace

CheckPlan plan_checks(const std::vector<Scenario>& scenarios, const fs::path& baselines_dir) {
  CheckPlan plan;
  std::map<std::string, size_t> by_key;   // run key + K -> baseline
  std::map<std::string, size_t> by_run;   // run key -> first baseline of that run (a reference)
  auto add = [&](const RunConfig& cfg, int64_t dp, int64_t K) {
    const std::string run = run_key(cfg, dp), key = run + "|K=" + std::to_string(K);
    if (auto it = by_key.find(key); it != by_key.end()) return it->second;
    // A reference (K = -1) is any baseline of the same run: a save only reads the state.
    if (K < 0)
      if (auto it = by_run.find(run); it != by_run.end()) return it->second;
    Baseline b;
    char id[16];
    std::snprintf(id, sizeof id, "b%02zu", plan.baselines.size());
    b.id = id;
    b.dir = baselines_dir / id;
    b.cfg = cfg;
    b.dp_size = dp;
    b.save_at = K;
    plan.baselines.push_back(b);
    by_key[key] = plan.baselines.size() - 1;
    by_run.emplace(run, plan.baselines.size() - 1);
    return plan.baselines.size() - 1;
  };
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    PlannedCell c;
    c.scenario = i;
    c.baseline = add(s.cfg, s.dp_size, s.save_at);
    Baseline& b = plan.baselines[c.baseline];
    const std::string pk = policy_key(s.policy);
    c.save = b.saves.size();
    for (size_t k = 0; k < b.saves.size(); ++k)
      if (policy_key(b.saves[k].policy) == pk) c.save = k;
    if (c.save == b.saves.size())
      b.saves.push_back({(b.dir / "checkpoints" / std::to_string(c.save)).string(), s.policy});
    c.reference = s.resharded() ? add(s.cfg, s.resume_dp(), -1) : c.baseline;
    plan.cells.push_back(c);
  }
  return plan;
}

void run_baseline(const Baseline& b, const std::string& tool, double timeout_s) {
  remove_tree_below(b.dir.parent_path(), b.dir.filename());
  fs::create_directories(b.dir);
  const std::string what = "baseline " + b.id + " (" + b.dir.string() + ")";
  if (b.dp_size <= 1) {
    // In this process: it needs no isolation (it is the reference), which saves a LibTorch
    // start-up; every resumed run is a new process.
    TrainJob job;
    job.cfg = b.cfg;
    job.out_dir = b.dir.string();
    job.saves = b.saves;
    job.save_at = b.save_at;
    job.dump_states = true;
    job.quiet = true;
    try {
      run_train(job);
    } catch (const std::exception& e) {
      throw std::runtime_error(what + " failed: " + e.what());
    }
    return;
  }
  const fs::path cfg = b.dir / "config.json", plan = b.dir / "save_plan.json", log = b.dir / "train.log";
  write_text(cfg.string(), to_json(b.cfg).dump(2) + "\n");
  std::vector<std::string> argv =
      {tool,           "train",         "--config", cfg.string(), "--out",
       b.dir.string(), "--dump-states", "--quiet",  "--nproc",    std::to_string(b.dp_size)};
  if (!b.saves.empty()) {
    write_save_plan(plan.string(), b.saves);
    argv.insert(argv.end(), {"--save-plan", plan.string(), "--save-at", std::to_string(b.save_at)});
  }
  const auto e = run_process(argv, log.string(), timeout_s, /*prestarted=*/true);
  if (!e.ok()) throw std::runtime_error(what + " " + e.describe() + ": " + tail_of_file(log.string(), 600));
}

void prune_baseline(const Baseline& b) {
  for (const char* d : {"checkpoints", "state_at_save", "state_final"}) remove_tree_below(b.dir, d);
}

}   // namespace rh
