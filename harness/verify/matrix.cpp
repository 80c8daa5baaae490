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

#include "harness/base/beneath.h"
#include "harness/base/dir_lock.h"
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

// The plan of the built-in cells (external ones have no baseline), indexed into all of `selected`.
CheckPlan plan_builtin(const std::vector<Scenario>& selected, const fs::path& dir) {
  std::vector<Scenario> builtin;
  std::vector<size_t> index;
  for (size_t i = 0; i < selected.size(); ++i)
    if (!selected[i].trainer) builtin.push_back(selected[i]), index.push_back(i);
  CheckPlan plan = plan_checks(builtin, dir);
  for (auto& cell : plan.cells) cell.scenario = index[cell.scenario];
  return plan;
}

std::vector<size_t> external_cells(const std::vector<Scenario>& selected) {
  std::vector<size_t> out;
  for (size_t i = 0; i < selected.size(); ++i)
    if (selected[i].trainer) out.push_back(i);
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

std::string fmt_seconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(seconds) / 60, static_cast<int>(seconds) % 60);
  return buf;
}

// "1 baseline", "2 baselines".
std::string plural(size_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

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

  Schedule(const CheckPlan& check_plan, std::vector<size_t> external_scenarios)
      : plan(check_plan),
        external(std::move(external_scenarios)),
        baseline_done(check_plan.baselines.size()),
        cell_taken(check_plan.cells.size()),
        baseline_error(check_plan.baselines.size()),
        users(check_plan.baselines.size()) {
    for (const auto& cell : check_plan.cells) {
      ++users[cell.baseline];
      if (cell.reference != cell.baseline) ++users[cell.reference];
    }
  }
  bool ready(const PlannedCell& cell) const { return baseline_done[cell.baseline] && baseline_done[cell.reference]; }
  // The next task, in this order: the first ready cell, else the next baseline, else the next
  // external cell (kind 2). Blocks while nothing is ready but something runs; returns false when
  // every task is taken.
  bool take(std::unique_lock<std::mutex>& lock, int& kind, size_t& index) {
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
      cv.wait(lock);
    }
  }
};

// One matrix run in progress: the options, the selected scenarios, the plan, the results, and the
// schedule the workers share.
class MatrixRun {
 public:
  MatrixRun(const MatrixOptions& opts, std::vector<Scenario> selected, const fs::path& run_dir, std::ostream& log)
      : o_(opts),
        sel_(std::move(selected)),
        plan_(plan_builtin(sel_, run_dir / "baselines")),
        sched_(plan_, external_cells(sel_)),
        log_(log) {
    for (const auto& scenario : sel_) work_dirs_.push_back(scenario_work_dir(run_dir, scenario.name));
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
    std::unique_lock<std::mutex> lock(sched_.mu);
    int kind = 0;
    size_t index = 0;
    auto idle0 = Clock::now();
    while (sched_.take(lock, kind, index)) {
      phases_.add("idle", std::chrono::duration<double>(Clock::now() - idle0).count());
      const auto task0 = Clock::now();
      status(kind == 1   ? "checking " + sel_[plan_.cells[index].scenario].name
             : kind == 2 ? "running trainer of " + sel_[index].name
                         : "training baseline " + plan_.baselines[index].id);
      lock.unlock();
      if (kind == 1) check(index);
      else if (kind == 2) check_external(index);
      else train(index);
      lock.lock();
      phases_.add(kind == 1   ? "cells"
                  : kind == 2 ? "external_cells"
                              : "baselines",
                  std::chrono::duration<double>(Clock::now() - task0).count());
      sched_.cv.notify_all();
      idle0 = Clock::now();
    }
    phases_.add("idle", std::chrono::duration<double>(Clock::now() - idle0).count());   // the tail
  }

  // The progress line (sched_.mu held): one redrawn line on a terminal. Elsewhere (a CI log) the
  // progress is the count on each finished cell's line (report()), not a line per task started.
  void status(const std::string& current) {
    if (o_.verbosity == 0 || !o_.progress_tty) return;
    const double elapsed_seconds = elapsed();
    const size_t done = sched_.cells_done;
    const double eta = done ? elapsed_seconds / static_cast<double>(done) * static_cast<double>(sel_.size() - done) : 0;
    const std::string line = "[" + std::to_string(done) + "/" + std::to_string(sel_.size()) + "] elapsed " +
                             fmt_seconds(elapsed_seconds) + (done ? ", ETA " + fmt_seconds(eta) : std::string()) +
                             " | " + current;
    log_ << "\r\033[K" << line << std::flush;
  }

  void train(size_t baseline) {
    std::string error;
    try {
      run_baseline(plan_.baselines[baseline], o_.tool, 900);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(sched_.mu);
    sched_.baseline_done[baseline] = true;
    sched_.baseline_error[baseline] = error;
    if (!error.empty())
      log_ << (o_.progress_tty ? "\r\033[K" : "") << "baseline " << plan_.baselines[baseline].id << " failed: " << error
           << "\n";
  }

  CheckOptions options_for(const Scenario& scenario, size_t scenario_index) const {
    CheckOptions options;
    options.tool = o_.tool;
    options.work_dir = work_dirs_[scenario_index];
    options.keep_checkpoints = o_.keep_checkpoints;
    if (!o_.golden_dir.empty())
      options.golden_csv = (fs::path(o_.golden_dir) / (safe_name(scenario.name) + ".csv")).string();
    options.update_golden = o_.update_golden;
    return options;
  }

  void check(size_t cell_index) {
    const PlannedCell& cell = plan_.cells[cell_index];
    const Scenario& scenario = sel_[cell.scenario];
    const CheckOptions options = options_for(scenario, cell.scenario);
    CellRuns runs;
    runs.baseline = plan_.baselines[cell.baseline].dir;
    runs.checkpoint = plan_.baselines[cell.baseline].saves.at(cell.save).root;
    runs.reference = plan_.baselines[cell.reference].dir;
    {
      std::lock_guard<std::mutex> lock(sched_.mu);
      runs.baseline_error = !sched_.baseline_error[cell.baseline].empty() ? sched_.baseline_error[cell.baseline]
                                                                          : sched_.baseline_error[cell.reference];
    }
    CheckResult result;
    try {
      reset_work_dir(options.work_dir);
      result = check_cell(scenario, runs, options);
    } catch (const std::exception& e) {   // the work directory itself could not be made
      result.name = scenario.name;
      result.expectation = to_string(scenario.expect.kind);
      result.first_divergence = e.what();
      judge(scenario, result);
    }
    std::lock_guard<std::mutex> lock(sched_.mu);
    results_[cell.scenario] = result;
    ++sched_.cells_done;
    release(cell.baseline);
    if (cell.reference != cell.baseline) release(cell.reference);
    report(result, cell.scenario);
  }

  // An external trainer's cell (external_check.h): no baseline, its own runs.
  void check_external(size_t scenario_index) {
    const Scenario& scenario = sel_[scenario_index];
    const CheckOptions options = options_for(scenario, scenario_index);
    CheckResult result;
    try {
      reset_work_dir(options.work_dir);
      result = check_external_cell(scenario, options);
    } catch (const std::exception& e) {
      result.name = scenario.name;
      result.expectation = to_string(scenario.expect.kind);
      result.first_divergence = e.what();
      judge(scenario, result);
    }
    std::lock_guard<std::mutex> lock(sched_.mu);
    results_[scenario_index] = result;
    ++sched_.cells_done;
    report(result, scenario_index);
  }

  // The last cell that needed a baseline's checkpoints and dumps is done (sched_.mu held).
  void release(size_t baseline) {
    if (--sched_.users[baseline] == 0 && !o_.keep_checkpoints) prune_baseline(plan_.baselines[baseline]);
  }

  // One line per finished cell; a failure with its verdict and the command that reproduces it.
  void report(const CheckResult& result, size_t scenario_index) {
    if (o_.verbosity == 0 && result.passed) return;
    if (o_.progress_tty) log_ << "\r\033[K";
    log_ << (result.passed ? "PASS " : "FAIL ") << result.name << "  (" << fmt_seconds(result.seconds) << ")"
         << (o_.progress_tty ? std::string()
                             : "  [" + std::to_string(sched_.cells_done) + "/" + std::to_string(sel_.size()) +
                                   ", elapsed " + fmt_seconds(elapsed()) + "]")
         << (result.passed ? ""
                           : "\n     " + result.verdict + "\n     reproduce: resume-harness check --file " + o_.file +
                                 " '" + result.name + "'")
         << (o_.verbosity >= 2 ? "\n     directory: " + work_dirs_[scenario_index] : std::string()) << "\n"
         << std::flush;   // a CI log shows each line as its cell ends
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

// The scenarios of opts.file that opts.filter selects; none is bad input, with the closest name.
std::vector<Scenario> select_or_refuse(const MatrixOptions& opts) {
  auto all = load_scenarios(opts.file);
  auto selected = select_scenarios(all, opts.filter);
  if (selected.empty()) {
    std::vector<std::string> names;
    for (const auto& s : all) names.push_back(s.name);
    throw std::invalid_argument(opts.file + ": no scenario matches '" + opts.filter + "'" +
                                did_you_mean(opts.filter, names));
  }
  return selected;
}

}   // namespace

std::string default_run_dir(const std::string& scenario_file) {
  return (fs::path("runs") / fs::path(scenario_file).stem()).string();
}

std::vector<std::string> list_matrix(const MatrixOptions& opts) {
  auto selected = select_or_refuse(opts);
  std::vector<std::string> out;
  const ShardPlan shards = plan_shards(selected, opts.shard.active() ? opts.shard.count : 1);
  for (size_t i = 0; i < selected.size(); ++i)
    if (!opts.shard.active() || shards.shard_of[i] == opts.shard.index) {
      std::string entry = selected[i].name;
      if (const auto& t = selected[i].trainer) {   // what an external cell runs, presets applied
        auto joined = [](const std::vector<std::string>& argv, const std::vector<std::string>& args) {
          std::string line;
          for (const auto* part : {&argv, &args})
            for (const auto& a : *part) line += (line.empty() ? "" : " ") + a;
          return line;
        };
        entry += "\n    command: " + joined(t->command, t->args) +
                 "\n    resume_command: " + joined(t->resume_command, t->args);
      }
      out.push_back(entry);
    }
  return out;
}

MatrixResult run_matrix(const MatrixOptions& opts, std::ostream& log) {
  auto selected = select_or_refuse(opts);
  RunSummary summary;
  summary.file = opts.file;
  summary.filter = opts.filter;
  summary.jobs = opts.jobs;
  summary.file_xxh3 = file_xxh3(opts.file);
  if (opts.shard.active()) {   // shard.h: whole baseline groups, the same split on every runner
    const ShardPlan shards = plan_shards(selected, opts.shard.count);
    std::vector<Scenario> mine;
    for (size_t i = 0; i < selected.size(); ++i) {
      summary.matrix_cells.push_back(selected[i].name);
      if (shards.shard_of[i] == opts.shard.index) mine.push_back(selected[i]);
    }
    summary.shard_index = opts.shard.index;
    summary.shard_count = opts.shard.count;
    log << "shard " << opts.shard.index << "/" << opts.shard.count << ": " << mine.size() << " of " << selected.size()
        << " scenarios (" << shards.cost[static_cast<size_t>(opts.shard.index - 1)] << " of "
        << std::accumulate(shards.cost.begin(), shards.cost.end(), int64_t{0}) << " iterations x ranks)\n";
    selected = std::move(mine);
  }
  const fs::path run_dir = opts.run_dir.empty() ? fs::path(default_run_dir(opts.file)) : fs::path(opts.run_dir);
  MatrixRun run(opts, std::move(selected), run_dir, log);   // refuses a bad scenario name before anything is written
  // One run at a time into a run directory: a second one would remove this one's baselines.
  const DirLock lock(run_dir);
  refuse_symlinks_in_run_dir(run_dir, run.scenarios(), opts.golden_dir);
  BeneathDir::open(run_dir, "scenarios", /*create=*/true);
  if (!opts.golden_dir.empty()) fs::create_directories(opts.golden_dir);
  MatrixResult out;
  out.results = run.run();
  size_t failed = 0;
  for (const auto& r : out.results) failed += r.passed ? 0 : 1;
  summary.run_dir = run_dir.string();
  summary.seconds = run.elapsed();
  const auto w0 = Clock::now();
  write_summary(summary, run.scenarios(), out.results);
  write_junit((run_dir / "junit.xml").string(), fs::path(opts.file).stem().string(), out.results);
  if (!opts.junit_path.empty()) write_junit(opts.junit_path, fs::path(opts.file).stem().string(), out.results);
  // phases.json: worker seconds by task kind and idle, the summaries' writing, the wall time
  // (bench/bench_matrix.cpp reads it with each process's and each cell's phases.json).
  write_text((run_dir / "phases.json").string(),
             nlohmann::json({{"jobs", std::max(1, opts.jobs)},
                             {"wall", run.elapsed()},
                             {"workers", run.phases().seconds()},
                             {"summaries", std::chrono::duration<double>(Clock::now() - w0).count()}})
                     .dump(2) +
                 "\n");
  log << (run.scenarios().size() - failed) << " passed, " << failed << " failed (" << fmt_seconds(run.elapsed()) << ", "
      << plural(run.baselines(), "baseline") << " for " << plural(run.scenarios().size(), "scenario")
      << "), run directory "
      << run_dir.string() << "\n";
  // 2 when an external trainer's output or checkpoint could not be read (bad input, as elsewhere),
  // 4 when the disk failed under one (no space for its captured output, ...: cli/main.cpp's codes).
  bool bad_input = false, disk_failed = false;
  for (const auto& r : out.results) bad_input = bad_input || r.bad_input, disk_failed = disk_failed || r.disk_failed;
  out.exit_code = disk_failed ? 4 : bad_input ? 2 : failed ? 1 : 0;
  return out;
}

}   // namespace rh
