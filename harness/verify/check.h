// The resume check of one scenario cell. Its baseline (baseline.h: 0..N uninterrupted, saving the
// cell's checkpoint at K on the way; shared by the cells that differ only at save or load) has run;
// the check starts a new process that loads that checkpoint and trains K+1..N (it reports the load
// in load_result.json), then compares every state right after load with what was saved, every
// metric of K+1..N bit for bit, the final states key by key, checks the negative controls, names
// the first divergence, and judges the expectation (and the golden metrics, when asked) before it
// writes anything. Resharded cells (resume_dp_size != dp_size) are compared with their reference,
// the uninterrupted run at the resumed size (the reduction order differs between sizes); their
// state right after load, joined across shards, must equal the saved state bit for bit whatever the
// expectation.
#pragma once
#include <filesystem>
#include <string>

#include "harness/base/beneath.h"
#include "harness/verify/check_result.h"
#include "harness/verify/scenario.h"

namespace rh {

struct CheckOptions {
  std::string tool;       // path of the resume-harness executable to run children with
  std::string work_dir;   // per-scenario directory (removed and created)
  bool keep_checkpoints = false;
  double timeout_s = 900;       // per child process
  std::string golden_csv;       // if set: the baseline's metrics must equal this file bit for bit
  bool update_golden = false;   // write golden_csv from the baseline instead
};

// What the shared runs left for one cell: its baseline, the checkpoint it resumes from, its
// reference (== baseline unless resharded). baseline_error: the baseline or reference failed.
struct CellRuns {
  std::filesystem::path baseline, checkpoint, reference;
  std::string baseline_error;
};

// Removes and creates a cell's work directory; refuses one that names "", ".", ".." or a root.
void reset_work_dir(const std::string& work_dir);
// A cell's work directory (<run dir>/scenarios/<cell>), or `below` inside it, opened from the run
// directory without following a link at any step (base/beneath.h), made when create. Everything
// the tool writes or removes in a cell after a trainer ran goes through this, so a cell directory
// the trainer replaced with a link is a SymlinkRefused naming it, at the moment of the write.
BeneathDir open_work_dir(const std::string& work_dir, const std::filesystem::path& below = {}, bool create = false);

// The check of one cell whose runs are done (never throws for scenario outcomes; a child that
// crashes is an "error" outcome). Writes result.json, metrics_compare.csv, state_compare.csv,
// disk.csv and baseline/metrics.csv (a copy, for the report) into opts.work_dir, which must exist.
CheckResult check_cell(const Scenario& scenario, const CellRuns& runs, const CheckOptions& opts);

// One scenario on its own: resets work_dir, runs its baseline (and reference) there, then
// check_cell.
CheckResult run_check(const Scenario& scenario, const CheckOptions& opts);

// Applies the expectation to a filled result (sets passed, verdict), then an external cell's
// expect_diagnosis / expect_first_divergence. Exposed for tests.
void judge(const Scenario& scenario, CheckResult& result);
void judge_expectation(const Scenario& scenario, CheckResult& result);   // the expectation alone

}   // namespace rh
