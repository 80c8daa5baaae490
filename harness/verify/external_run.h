// Running an external trainer's command for its cell (external_check.h): one run per call, in its
// own directory <cell>/<label> with a save/ directory inside, the placeholders ({iterations},
// {save_at}, {save_dir}, {load_dir}, {run_dir}, {tool}) expanded, its metrics and probe records
// read back.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/verify/check.h"
#include "harness/verify/external_compare.h"
#include "harness/verify/external_metrics.h"
#include "harness/verify/run_varied.h"

namespace rh::external {

// A failed run's stderr tail as one line: its last lines (the text given is already cut to the
// file's last bytes; a first partial line is dropped when others follow), blank lines left out,
// each line's control bytes escaped, joined by " | ", at most about 400 characters.
std::string stderr_tail(const std::string& text);

// What one run left.
struct RunOut {
  std::string label;
  std::filesystem::path dir, save_dir;
  MetricLog metrics;
  std::vector<ProbeRecord> probe;
  double seconds = 0;
  RunSide side;   // what the harness gave it: placeholders and arguments (run_varied.h)
};

class Runner {
 public:
  Runner(const Scenario& s, const CheckOptions& o)
      : s_(s), t_(*s.trainer), o_(o), work_(std::filesystem::absolute(o.work_dir)) {}

  // One run: its directory <cell>/<label> (run_dir), save_dir inside it, a copy of seed_save_dir
  // when given; command (resume_command when `resume`) with {iterations} = iterations and
  // {load_dir} = load_dir (its own save_dir when empty). Throws std::runtime_error when it fails
  // (its stderr's tail) or prints past the cap, std::invalid_argument for malformed output.
  RunOut run(const std::string& label, bool resume, int64_t iterations, const std::filesystem::path& load_dir,
             const std::optional<std::filesystem::path>& seed_save_dir);

  // The checkpoint a run left for an iteration ("" when the path names none per iteration and
  // `iteration` is not the run's last).
  std::filesystem::path checkpoint(const RunOut& r, int64_t iterations, int64_t iteration,
                                   const std::filesystem::path& load_dir) const;

  // The seconds every run so far took.
  double trainer_seconds() const { return trainer_seconds_; }

 private:
  std::map<std::string, std::string> vars_for(const RunOut& r, int64_t iterations,
                                              const std::filesystem::path& load_dir) const;
  std::string cwd_for(const RunOut& r) const;
  MetricLog read_metrics(const RunOut& r, const std::map<std::string, std::string>& vars,
                         const std::string& stdout_path);

  const Scenario& s_;
  const ExternalTrainer& t_;
  const CheckOptions& o_;
  const std::filesystem::path work_;
  double trainer_seconds_ = 0;
};

}   // namespace rh::external
