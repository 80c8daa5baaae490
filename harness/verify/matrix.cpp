// The matrix runner; see matrix.h. run_matrix: select and plan, run the plan's tasks on `jobs`
// workers (baselines, then each cell once its runs are done), write the summaries.
#include "harness/verify/matrix.h"

#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <numeric>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "harness/base/no_follow.h"
#include "harness/base/phases.h"
#include "harness/base/suggest.h"
#include "harness/base/text.h"
#include "harness/verify/baseline.h"
#include "harness/verify/external_check.h"
#include "harness/verify/writers.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

// The plan of the built-in cells (external ones have no baseline), indexed into all of `sel`.
CheckPlan plan_builtin(const std::vector<Scenario>& sel, const fs::path& dir) {
  std::vector<Scenario> builtin;
  std::vector<size_t> index;
  for (size_t i = 0; i < sel.size(); ++i)
    if (!sel[i].trainer) builtin.push_back(sel[i]), index.push_back(i);
  CheckPlan p = plan_checks(builtin, dir);
  for (auto& c : p.cells) c.scenario = index[c.scenario];
  return p;
}

std::vector<size_t> external_cells(const std::vector<Scenario>& sel) {
  std::vector<size_t> out;
  for (size_t i = 0; i < sel.size(); ++i)
    if (sel[i].trainer) out.push_back(i);
  return out;
}

// The scenario file's identity for `report --merge`: shards of one matrix read the same bytes.
std::string file_xxh3(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

using Clock = std::chrono::steady_clock;

// The plan's tasks and what is done of them; every member is guarded by `mu`. A task is a
// baseline (index < baselines) or a cell; a cell is ready when its baseline and reference are.
struct Schedule {
  const CheckPlan& plan;
  std::mutex mu;
  std::condition_variable cv;
  size_t next_baseline = 0, next_cell = 0, next_external = 0, cells_done = 0;
  std::vector<size_t> external;   // scenario indices of external-trainer cells (no baseline; always ready)
  std::vector<bool> baseline_done, cell_taken;
  std::vector<std::string> baseline_error;
  std::vector<size_t> users;   // cells not yet checked that use a baseline (as baseline or reference)

  Schedule(const CheckPlan& p, std::vector<size_t> ext)
      : plan(p),
        external(std::move(ext)),
        baseline_done(p.baselines.size()),
        cell_taken(p.cells.size()),
        baseline_error(p.baselines.size()),
        users(p.baselines.size()) {
    for (const auto& c : p.cells) {
      ++users[c.baseline];
      if (c.reference != c.baseline) ++users[c.reference];
    }
  }
  bool ready(const PlannedCell& c) const { return baseline_done[c.baseline] && baseline_done[c.reference]; }
  // The next task, in this order: the first ready cell, else the next baseline, else the next
  // external cell (kind 2). Blocks while nothing is ready but something runs; returns false when
  // every task is taken.
  bool take(std::unique_lock<std::mutex>& lk, int& kind, size_t& index) {
    while (true) {
      for (size_t i = next_cell; i < plan.cells.size(); ++i)
        if (!cell_taken[i] && ready(plan.cells[i])) {
          cell_taken[i] = true;
          while (next_cell < cell_taken.size() && cell_taken[next_cell]) ++next_cell;
          kind = 1, index = i;
          return true;
        }
      if (next_baseline < plan.baselines.size()) {
        kind = 0, index = next_baseline++;
        return true;
      }
      if (next_external < external.size()) {
        kind = 2, index = external[next_external++];
        return true;
      }
      if (next_cell >= plan.cells.size()) return false;
      cv.wait(lk);
    }
  }
};

// One matrix run in progress: the options, the selected scenarios, the plan, the results, and the
// schedule the workers share.
class MatrixRun {
 public:
  MatrixRun(const MatrixOptions& o, std::vector<Scenario> sel, const fs::path& run_dir, std::ostream& log)
      : o_(o),
        sel_(std::move(sel)),
        plan_(plan_builtin(sel_, run_dir / "baselines")),
        sched_(plan_, external_cells(sel_)),
        log_(log) {
    for (const auto& s : sel_) work_dirs_.push_back(scenario_work_dir(run_dir, s.name));
    results_.resize(sel_.size());
  }

  // Runs every task on `jobs` workers; returns the results in scenario order.
  std::vector<CheckResult> run() {
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, o_.jobs); ++t) threads.emplace_back([this] { worker(); });
    for (auto& t : threads) t.join();
    if (o_.progress_tty) log_ << "\r\033[K";
    return results_;
  }
  const std::vector<Scenario>& scenarios() const { return sel_; }
  size_t baselines() const { return plan_.baselines.size(); }
  // Worker seconds by task kind and idle (waiting for a baseline, or done while others run);
  // read after run() returns.
  const PhaseTimes& phases() const { return phases_; }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  void worker() {
    std::unique_lock<std::mutex> lk(sched_.mu);
    int kind = 0;
    size_t index = 0;
    auto idle0 = Clock::now();
    while (sched_.take(lk, kind, index)) {
      phases_.add("idle", std::chrono::duration<double>(Clock::now() - idle0).count());
      const auto task0 = Clock::now();
      status(kind == 1   ? "checking " + sel_[plan_.cells[index].scenario].name
             : kind == 2 ? "running trainer of " + sel_[index].name
                         : "training baseline " + plan_.baselines[index].id);
      lk.unlock();
      if (kind == 1) check(index);
      else if (kind == 2) check_external(index);
      else train(index);
      lk.lock();
      phases_.add(kind == 1   ? "cells"
                  : kind == 2 ? "external_cells"
                              : "baselines",
                  std::chrono::duration<double>(Clock::now() - task0).count());
      sched_.cv.notify_all();
      idle0 = Clock::now();
    }
    phases_.add("idle", std::chrono::duration<double>(Clock::now() - idle0).count());   // the tail
  }

  // The progress line (sched_.mu held): one redrawn line on a terminal, else a line per change.
  void status(const std::string& current) {
    if (o_.verbosity == 0) return;
    const double e = elapsed();
    const size_t d = sched_.cells_done;
    const double eta = d ? e / static_cast<double>(d) * static_cast<double>(sel_.size() - d) : 0;
    const std::string line = "[" + std::to_string(d) + "/" + std::to_string(sel_.size()) + "] elapsed " +
                             fmt_seconds(e) + (d ? ", ETA " + fmt_seconds(eta) : std::string()) + " | " + current;
    if (o_.progress_tty) log_ << "\r\033[K" << line << std::flush;
    else log_ << line << "\n" << std::flush;
  }

  void train(size_t b) {
    std::string err;
    try {
      run_baseline(plan_.baselines[b], o_.tool, 900);
    } catch (const std::exception& e) {
      err = e.what();
    }
    std::lock_guard<std::mutex> lk(sched_.mu);
    sched_.baseline_done[b] = true;
    sched_.baseline_error[b] = err;
    if (!err.empty())
      log_ << (o_.progress_tty ? "\r\033[K" : "") << "baseline " << plan_.baselines[b].id << " failed: " << err << "\n";
  }

  CheckOptions options_for(const Scenario& s, size_t i) const {
    CheckOptions co;
    co.tool = o_.tool;
    co.work_dir = work_dirs_[i];
    co.keep_checkpoints = o_.keep_checkpoints;
    if (!o_.golden_dir.empty()) co.golden_csv = (fs::path(o_.golden_dir) / (safe_name(s.name) + ".csv")).string();
    co.update_golden = o_.update_golden;
    return co;
  }

  void check(size_t i) {
    const PlannedCell& c = plan_.cells[i];
    const Scenario& s = sel_[c.scenario];
    const CheckOptions co = options_for(s, c.scenario);
    CellRuns runs;
    runs.baseline = plan_.baselines[c.baseline].dir;
    runs.checkpoint = plan_.baselines[c.baseline].saves.at(c.save).root;
    runs.reference = plan_.baselines[c.reference].dir;
    {
      std::lock_guard<std::mutex> lk(sched_.mu);
      runs.baseline_error = !sched_.baseline_error[c.baseline].empty() ? sched_.baseline_error[c.baseline]
                                                                       : sched_.baseline_error[c.reference];
    }
    CheckResult r;
    try {
      reset_work_dir(co.work_dir);
      r = check_cell(s, runs, co);
    } catch (const std::exception& e) {   // the work directory itself could not be made
      r.name = s.name;
      r.expectation = to_string(s.expect.kind);
      r.first_divergence = e.what();
      judge(s, r);
    }
    std::lock_guard<std::mutex> lk(sched_.mu);
    results_[c.scenario] = r;
    ++sched_.cells_done;
    release(c.baseline);
    if (c.reference != c.baseline) release(c.reference);
    report(r, c.scenario);
  }

  // An external trainer's cell (external_check.h): no baseline, its own runs.
  void check_external(size_t i) {
    const Scenario& s = sel_[i];
    const CheckOptions co = options_for(s, i);
    CheckResult r;
    try {
      reset_work_dir(co.work_dir);
      r = check_external_cell(s, co);
    } catch (const std::exception& e) {
      r.name = s.name;
      r.expectation = to_string(s.expect.kind);
      r.first_divergence = e.what();
      judge(s, r);
    }
    std::lock_guard<std::mutex> lk(sched_.mu);
    results_[i] = r;
    ++sched_.cells_done;
    report(r, i);
  }

  // The last cell that needed a baseline's checkpoints and dumps is done (sched_.mu held).
  void release(size_t b) {
    if (--sched_.users[b] == 0 && !o_.keep_checkpoints) prune_baseline(plan_.baselines[b]);
  }

  // One line per finished cell; a failure with its verdict and the command that reproduces it.
  void report(const CheckResult& r, size_t i) {
    if (o_.verbosity == 0 && r.passed) return;
    if (o_.progress_tty) log_ << "\r\033[K";
    log_ << (r.passed ? "PASS " : "FAIL ") << r.name << "  (" << fmt_seconds(r.seconds) << ")"
         << (r.passed ? ""
                      : "\n     " + r.verdict + "\n     reproduce: resume-harness check --file " + o_.file + " '" +
                            r.name + "'")
         << (o_.verbosity >= 2 ? "\n     directory: " + work_dirs_[i] : std::string()) << "\n";
  }

  const MatrixOptions& o_;
  std::vector<Scenario> sel_;
  std::vector<std::string> work_dirs_;   // every name is checked before anything runs
  CheckPlan plan_;
  Schedule sched_;
  std::vector<CheckResult> results_;
  std::ostream& log_;
  PhaseTimes phases_;   // guarded by sched_.mu
  const Clock::time_point t0_ = Clock::now();
};

}   // namespace

std::string scenario_work_dir(const std::filesystem::path& run_dir, const std::string& scenario) {
  const fs::path parent = run_dir / "scenarios";
  const fs::path dir = parent / safe_name(scenario);
  // safe_name guarantees this; checked again because the directory is removed before each run.
  if (dir.parent_path() != parent || dir.filename() == "." || dir.filename() == ".." || dir.filename().empty())
    throw std::logic_error("scenario directory " + dir.string() + " is not a child of " + parent.string());
  return dir.string();
}

void refuse_symlinks_in_run_dir(const fs::path& run_dir, const std::vector<std::string>& cells) {
  // What a matrix run (or a merge) removes or writes below its run directory, and what `report`
  // writes after it (reports/report.cpp checks those again: `report` runs on its own too).
  std::vector<std::string> below = {"scenarios", "baselines",   "summary.csv",    "summary.json", "junit.xml",
                                    "report.md", "report.html", "projection.csv", "plots",        "phases.json"};
  for (const auto& c : cells) below.push_back("scenarios/" + safe_name(c));
  refuse_symlinks_below(run_dir, below);
}

void refuse_symlinks_in_run_dir(const fs::path& run_dir, const std::vector<Scenario>& scenarios,
                                const std::string& golden_dir) {
  std::vector<std::string> cells;
  for (const auto& s : scenarios) cells.push_back(s.name);
  refuse_symlinks_in_run_dir(run_dir, cells);
  if (golden_dir.empty()) return;
  for (const auto& s : scenarios) refuse_symlinks_below(golden_dir, safe_name(s.name) + ".csv");
}

namespace {

// The scenarios of o.file that o.filter selects; none is bad input, with the closest name.
std::vector<Scenario> select_or_refuse(const MatrixOptions& o) {
  auto all = load_scenarios(o.file);
  auto sel = select_scenarios(all, o.filter);
  if (sel.empty()) {
    std::vector<std::string> names;
    for (const auto& s : all) names.push_back(s.name);
    throw std::invalid_argument(o.file + ": no scenario matches '" + o.filter + "'" + did_you_mean(o.filter, names));
  }
  return sel;
}

}   // namespace

std::string default_run_dir(const std::string& scenario_file) {
  return (fs::path("runs") / fs::path(scenario_file).stem()).string();
}

std::vector<std::string> list_matrix(const MatrixOptions& o) {
  auto sel = select_or_refuse(o);
  std::vector<std::string> out;
  const ShardPlan sp = plan_shards(sel, o.shard.active() ? o.shard.count : 1);
  for (size_t i = 0; i < sel.size(); ++i)
    if (!o.shard.active() || sp.shard_of[i] == o.shard.index) out.push_back(sel[i].name);
  return out;
}

MatrixResult run_matrix(const MatrixOptions& o, std::ostream& log) {
  auto sel = select_or_refuse(o);
  RunSummary summary;
  summary.file = o.file;
  summary.filter = o.filter;
  summary.jobs = o.jobs;
  summary.file_xxh3 = file_xxh3(o.file);
  if (o.shard.active()) {   // shard.h: whole baseline groups, the same split on every runner
    const ShardPlan sp = plan_shards(sel, o.shard.count);
    std::vector<Scenario> mine;
    for (size_t i = 0; i < sel.size(); ++i) {
      summary.matrix_cells.push_back(sel[i].name);
      if (sp.shard_of[i] == o.shard.index) mine.push_back(sel[i]);
    }
    summary.shard_index = o.shard.index;
    summary.shard_count = o.shard.count;
    log << "shard " << o.shard.index << "/" << o.shard.count << ": " << mine.size() << " of " << sel.size()
        << " scenarios (" << sp.cost[static_cast<size_t>(o.shard.index - 1)] << " of "
        << std::accumulate(sp.cost.begin(), sp.cost.end(), int64_t{0}) << " iterations x ranks)\n";
    sel = std::move(mine);
  }
  const fs::path run_dir = o.run_dir.empty() ? fs::path(default_run_dir(o.file)) : fs::path(o.run_dir);
  MatrixRun run(o, std::move(sel), run_dir, log);   // refuses a bad scenario name before anything is written
  refuse_symlinks_in_run_dir(run_dir, run.scenarios(), o.golden_dir);
  fs::create_directories(run_dir / "scenarios");
  if (!o.golden_dir.empty()) fs::create_directories(o.golden_dir);
  MatrixResult out;
  out.results = run.run();
  size_t failed = 0;
  for (const auto& r : out.results) failed += r.passed ? 0 : 1;
  summary.run_dir = run_dir.string();
  summary.seconds = run.elapsed();
  const auto w0 = Clock::now();
  write_summary(summary, run.scenarios(), out.results);
  write_junit((run_dir / "junit.xml").string(), fs::path(o.file).stem().string(), out.results);
  if (!o.junit_path.empty()) write_junit(o.junit_path, fs::path(o.file).stem().string(), out.results);
  // phases.json: worker seconds by task kind and idle, the summaries' writing, the wall time
  // (bench/bench_matrix.cpp reads it with each process's and each cell's phases.json).
  write_text((run_dir / "phases.json").string(),
             nlohmann::json({{"jobs", std::max(1, o.jobs)},
                             {"wall", run.elapsed()},
                             {"workers", run.phases().seconds()},
                             {"summaries", std::chrono::duration<double>(Clock::now() - w0).count()}})
                     .dump(2) +
                 "\n");
  log << (run.scenarios().size() - failed) << " passed, " << failed << " failed (" << fmt_seconds(run.elapsed()) << ", "
      << run.baselines() << " baselines for " << run.scenarios().size() << " scenarios), run directory "
      << run_dir.string() << "\n";
  // 2 when an external trainer's output or checkpoint could not be read (bad input, as elsewhere).
  bool bad_input = false;
  for (const auto& r : out.results) bad_input = bad_input || r.bad_input;
  out.exit_code = bad_input ? 2 : failed ? 1 : 0;
  return out;
}

}   // namespace rh
