// Plot inputs and the plots.py child process; see plots_runner.h.
#include "reports/plots_runner.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/process/process.h"
#include "harness/base/data_files.h"

namespace fs = std::filesystem;

namespace rh::report {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// execv needs a path: a bare name ("python3") is looked up on PATH like a shell would.
std::string resolve_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const std::string path = env_or("PATH", "/usr/bin:/bin");
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const fs::path cand = fs::path(path.substr(start, end - start)) / name;
    if (access(cand.c_str(), X_OK) == 0) return cand.string();
    start = end + 1;
  }
  return name;
}

// "28.57 %" -> "28.57": the plot shows the table's number.
std::string pct_number(const std::string& text) { return text.substr(0, text.find(' ')); }

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  const auto nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

}   // namespace

void write_plot_inputs(const RunData& run, const std::vector<Combo>& combos) {
  const fs::path dir = fs::path(run.dir) / "plots";
  fs::create_directories(dir);
  // Old plots must not survive into a report whose plotting failed.
  for (const char* p : {kLossPlot, kDlossPlot, kDiskPlot, kUlpPlot}) fs::remove(dir / p);
  std::string idx = "scenario,group,dir,save_at,iterations,passed,outcome\n";
  for (const auto& s : run.scenarios)
    idx += csv_field(s.row.scenario) + "," + csv_field(s.group) + "," + csv_field(s.rel_dir) + "," +
           (s.save_at >= 0 ? std::to_string(s.save_at) : "") + "," +
           (s.iterations >= 0 ? std::to_string(s.iterations) : "") + "," + (s.row.passed ? "1" : "0") + "," +
           to_string(s.row.outcome) + "\n";
  write_report_file((dir / "index.csv").string(), idx);
  // One row per storage combination and key kind; reduction_pct is the text the tables show.
  std::string st = "storage,save_policy,kind,bytes,total_bytes,is_reference,reduction_pct\n";
  for (const auto& c : combos) {
    const bool is_ref = c.reference == static_cast<int>(c.scenario);
    for (const auto& k : disk_kinds()) {
      if (!c.bytes.count(k)) continue;
      st += csv_field(c.label) + "," + csv_field(c.policy) + "," + k + "," + std::to_string(c.bytes.at(k)) + "," +
            std::to_string(c.total_bytes) + "," + (is_ref ? "1" : "0") + "," +
            (c.has_reduction ? pct_number(reduction_text(c.reduction_pct)) : "") + "\n";
    }
  }
  write_report_file((dir / "storage.csv").string(), st);
}

PlotOutcome run_plots(const RunData& run) {
  PlotOutcome out;
  const std::string python = env_or("RH_PYTHON", "/usr/bin/python3");
  const std::string script = env_or("RH_PLOTS_SCRIPT", data_file("reports/plots.py"));
  const fs::path dir = fs::path(run.dir) / "plots";
  const std::string log = (dir / "plots.log").string();
  fs::remove(log);
  if (!fs::exists(script)) {
    out.message = "plot script " + script + " not found (set RH_PLOTS_SCRIPT)";
    return out;
  }
  ChildExit r;
  try {
    // 300 s: four small figures take a few seconds; the limit only guards against a hung child.
    r = run_process({resolve_executable(python), script, run.dir}, log, 300);
  } catch (const std::exception& e) {
    out.message = "cannot run " + python + ": " + e.what();
    return out;
  }
  const std::string tail = one_line(tail_of_file(log, 600));
  if (r.exit_code == kNoMatplotlibExit) {
    out.message = "matplotlib cannot be imported by " + python +
                  " (install python3-matplotlib, or set RH_PYTHON to an interpreter that has it)";
  } else if (r.exit_code == 127) {
    out.message = "cannot run " + python + " (set RH_PYTHON to a Python 3 with matplotlib): " + tail;
  } else if (r.exit_code != 0) {
    out.message = python + " " + script + " exited with " + std::to_string(r.exit_code) +
                  (r.timed_out ? " (timed out)" : "") + (tail.empty() ? "" : ": " + tail) + " (log: " + log + ")";
  }
  for (const char* p : {kLossPlot, kDlossPlot, kDiskPlot, kUlpPlot})
    if (fs::exists(dir / p)) out.written.push_back(std::string("plots/") + p);
  if (out.message.empty() && out.written.size() != 4) out.message = "plots.py exited 0 but did not write every plot";
  out.ok = out.message.empty();
  return out;
}

}   // namespace rh::report
