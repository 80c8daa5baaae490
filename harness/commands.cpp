// The check and matrix subcommands (report registers its own, see reports/report.h), and small
// shared flag parsers; see commands.h.
#include "harness/commands.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "harness/matrix.h"
#include "harness/process.h"
#include "reports/data_files.h"
#include "reports/report.h"

namespace rh {
namespace {

constexpr const char* kDefaultScenarioFile = "scenarios/default.toml";

struct CommandState {
  MatrixOptions check, matrix;
  bool no_report = false;
  CLI::App* check_cmd = nullptr;
  CLI::App* matrix_cmd = nullptr;
  ReportCommand report;
};

CommandState& state() {
  static CommandState s;
  return s;
}

void add_matrix_options(CLI::App& c, MatrixOptions& o, const std::string& default_run_dir) {
  c.add_option("-j,--jobs", o.jobs, "scenarios run at a time")->check(CLI::Range(1, 64))->capture_default_str();
  c.add_option("--run-dir", o.run_dir, "run directory")->default_str(default_run_dir);
  c.add_flag("--keep-checkpoints", o.keep_checkpoints, "keep each scenario's checkpoint in the run directory");
  c.add_option("--golden", o.golden_dir, "compare each baseline's metrics bitwise with golden CSVs in DIR");
  c.add_flag("--update-golden", o.update_golden, "rewrite the golden CSVs instead of comparing");
}

}  // namespace

ckpt::SavePolicy parse_policy(const std::string& policy, const std::vector<std::string>& overrides) {
  ckpt::SavePolicy p;
  p.kind = ckpt::parse_save_policy(policy);
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--save-override '" + o + "': expected KEY=DTYPE");
    const std::string key = o.substr(0, eq);
    if (key != "master_param" && key != "exp_avg" && key != "exp_avg_sq")
      throw std::invalid_argument("--save-override '" + o +
                                  "': key must be master_param, exp_avg or exp_avg_sq");
    p.overrides[key] = optim::parse_dtype(o.substr(eq + 1), "--save-override " + key);
  }
  return p;
}

void register_commands(CLI::App& app) {
  auto& st = state();
  // Both take the scenario file as -f/--file; matrix also as its first argument (matrix FILE).
  st.check.file = kDefaultScenarioFile;
  st.check_cmd = app.add_subcommand("check", "run the resume check of one scenario (or those matching a filter)");
  st.check_cmd->add_option("SCENARIO", st.check.filter,
                           "canonical scenario name, a substring of names, or a glob with *")->required();
  st.check_cmd->add_option("-f,--file", st.check.file, "scenario file")->capture_default_str();
  add_matrix_options(*st.check_cmd, st.check, "reports/runs/check");
  st.matrix_cmd = app.add_subcommand("matrix", "run every scenario of a matrix file and write a run directory");
  auto* pos = st.matrix_cmd->add_option("FILE", st.matrix.file, "scenario file, e.g. scenarios/default.toml");
  st.matrix_cmd->add_option("-f,--file", st.matrix.file, "scenario file (the same as FILE)")->excludes(pos);
  st.matrix_cmd->add_option("--filter", st.matrix.filter, "only scenarios matching this name/substring/glob");
  st.matrix_cmd->add_flag("--no-report", st.no_report, "do not write report.md / report.html at the end");
  add_matrix_options(*st.matrix_cmd, st.matrix, "reports/runs/<file stem>");
  register_report_command(app, st.report);
}

int run_commands(CLI::App&) {
  auto& st = state();
  for (auto [cmd, opts] : {std::pair{st.check_cmd, &st.check}, std::pair{st.matrix_cmd, &st.matrix}}) {
    if (!*cmd) continue;
    if (opts->file.empty())
      throw std::invalid_argument(std::string(cmd->get_name()) + ": give the scenario file (FILE or -f FILE)");
    // check's default file: ./scenarios/default.toml, else the copy beside the tool (an install).
    if (cmd == st.check_cmd && opts->file == kDefaultScenarioFile && !std::filesystem::exists(opts->file))
      opts->file = data_file(kDefaultScenarioFile);
    opts->tool = self_executable();
    opts->progress_tty = isatty(STDOUT_FILENO) != 0;
    if (cmd == st.check_cmd && opts->run_dir.empty()) opts->run_dir = "reports/runs/check";
    auto res = run_matrix(*opts, std::cout);
    if (cmd == st.check_cmd)
      for (const auto& r : res.results) std::cout << r.name << ": " << r.verdict << "\n";
    if (cmd == st.matrix_cmd && !st.no_report) {
      const std::string dir = opts->run_dir.empty()
                                  ? "reports/runs/" + std::filesystem::path(opts->file).stem().string()
                                  : opts->run_dir;
      const int rc = write_report(dir, std::cout);
      if (rc == 2) return 2;
    }
    return res.exit_code;
  }
  if (st.report.active()) return run_report_command(st.report, std::cout);
  return 2;
}

}  // namespace rh
