// The matrix run: every scenario of a file, several at a time, with a progress display, writing
// a run directory (summary.csv, summary.json, junit.xml, per-scenario results) and comparing each
// baseline's metrics bitwise against committed golden CSVs when asked. Cells that differ only at
// save or load share one baseline (baseline.h, in <run dir>/baselines/bNN); each cell's resumed run
// is still its own process, started once its baseline (and reference) has finished.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "harness/verify/check.h"
#include "harness/verify/shard.h"

namespace rh {

struct MatrixOptions {
  std::string file;      // scenario file
  std::string filter;    // canonical name / substring / glob ("" = all)
  std::string run_dir;   // default default_run_dir(file): runs/<file stem>
  int jobs = 1;
  bool keep_checkpoints = false;
  std::string golden_dir;       // compare baselines against golden CSVs here
  bool update_golden = false;   // rewrite them instead
  std::string tool;             // executable for the child processes
  bool progress_tty = false;    // redraw one status line (else plain lines)
  ShardSpec shard;              // --shard I/N: only this part of the selection (shard.h)
  std::string junit_path;       // --junit PATH: junit.xml written here too
  int verbosity = 1;            // 0 (-q): failures and the closing line; 1: progress and one
                                // line per cell; 2 (-v): also each cell's directory
};

// The names a run with these options would check (filter and shard applied), in order, without
// running anything (check/matrix --list); an external cell's entry adds two indented lines, its
// command and resume_command as the scenario file and any preset make them (placeholders kept).
std::vector<std::string> list_matrix(const MatrixOptions& opts);

// Where a matrix run writes when no --run-dir is given: runs/<file stem>, relative to the working
// directory (outside the source tree's rooms; the repository ignores runs/).
std::string default_run_dir(const std::string& scenario_file);

struct MatrixResult {
  std::vector<CheckResult> results;   // in scenario order
  // 0 all met expectations, 1 otherwise, 2 an external cell's files were unreadable, 4 the disk failed
  int exit_code = 0;
};

// Runs the matrix; throws ScenarioError / std::invalid_argument for bad input.
MatrixResult run_matrix(const MatrixOptions& opts, std::ostream& log);

// Throws SymlinkRefused (base/no_follow.h) when anything a matrix run of these scenarios removes or
// writes below run_dir (scenarios/, baselines/, each cell's directory, the summaries, junit.xml,
// the report files, plots/) or a golden CSV it may rewrite is a symbolic link. run_matrix calls it
// before anything is written.
void refuse_symlinks_in_run_dir(const std::filesystem::path& run_dir, const std::vector<Scenario>& scenarios,
                                const std::string& golden_dir);
// The same for a run directory of these cells (by name), without goldens (report --merge).
void refuse_symlinks_in_run_dir(const std::filesystem::path& run_dir, const std::vector<std::string>& cells);

// run_dir/scenarios/<safe_name(scenario)>: the only directory a matrix run removes and rewrites
// for a scenario. Throws ScenarioError for a name safe_name refuses.
std::string scenario_work_dir(const std::filesystem::path& run_dir, const std::string& scenario);

}   // namespace rh
