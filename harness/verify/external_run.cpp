// Running an external trainer's command; see external_run.h.
#include "harness/verify/external_run.h"

#include <cstdlib>
#include <stdexcept>
#include <system_error>

#include "harness/checkpoint/checked_io.h"
#include "harness/process/process.h"
#include "harness/verify/external_cell_dir.h"
#include "harness/verify/external_check.h"

namespace fs = std::filesystem;

namespace rh::external {

namespace {

constexpr uint64_t kMaxMetricsFileBytes = 256ull << 20;
constexpr size_t kStderrTailChars = 400;

std::string join_argv(const std::vector<std::string>& argv) {
  std::string joined;
  for (const auto& arg : argv) joined += (joined.empty() ? "" : " ") + arg;
  return joined.size() > 300 ? joined.substr(0, 300) + "..." : joined;
}

}   // namespace

std::string stderr_tail(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(std::move(line));
    start = end + 1;
  }
  // The file's tail was cut at a byte count: its first line is a fragment when a line break came after it.
  if (lines.size() > 1 && text.size() >= kStderrTailChars && text.find('\n') != std::string::npos &&
      text.front() != '\n')
    lines.erase(lines.begin());
  std::string joined;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const std::string quoted = ckpt::quote_text(*it, kStderrTailChars);
    if (!joined.empty() && joined.size() + quoted.size() + 3 > kStderrTailChars) break;
    joined = joined.empty() ? quoted : quoted + " | " + joined;
  }
  return joined;
}

RunOut Runner::run(const std::string& label, bool resume, int64_t iterations, const fs::path& load_dir,
                   const std::optional<fs::path>& seed_save_dir) {
  RunOut out;
  out.label = label;
  out.dir = work_ / label;
  out.save_dir = out.dir / "save";
  // From the run directory, no link followed: the previous run's trainer may have planted one.
  make_run_dir(work_, label, seed_save_dir ? *seed_save_dir : fs::path());
  const auto vars = vars_for(out, iterations, load_dir.empty() ? out.save_dir : load_dir);
  CapturedSpec c;
  out.side.vars = vars;
  for (const auto& a : resume ? t_.resume_command : t_.command) out.side.argv_template.push_back(a);
  for (const auto& a : t_.args) out.side.argv_template.push_back(a);
  for (const auto& a : out.side.argv_template) c.argv.push_back(expand_placeholders(a, vars));
  out.side.argv = c.argv;
  c.cwd = cwd_for(out);
  for (const auto& [k, v] : t_.env) c.env.emplace_back(k, expand_placeholders(v, vars));
  if (t_.probe) {
    cell_dir(work_, fs::path(label) / "probe", /*create=*/true);
    c.env.emplace_back("RH_PROBE_DIR", (out.dir / "probe").string());
    const std::string py = python_package_dir();
    const char* pp = std::getenv("PYTHONPATH");
    // probe = "auto": python/rhckpt/auto first, whose sitecustomize installs the hooks
    // (autoprobe.py); a resumed run's first optimizer step is K+1, and an uninterrupted run also
    // records the state right before step K+1 (what the resumed run's first step must start from).
    const std::string auto_dir = t_.probe_auto && !py.empty() ? (fs::path(py) / "rhckpt" / "auto").string() + ":" : "";
    if (!py.empty())
      c.env.emplace_back("PYTHONPATH", auto_dir + py + (pp && *pp ? ":" + std::string(pp) : std::string()));
    if (t_.probe_auto) {
      c.env.emplace_back("RH_PROBE_AUTO", "1");
      c.env.emplace_back("RH_PROBE_FIRST_ITERATION", std::to_string(resume ? s_.save_at + 1 : 1));
      c.env.emplace_back("RH_PROBE_BEFORE", std::to_string(!resume && iterations > s_.save_at ? s_.save_at + 1 : 0));
    }
  }
  c.stdout_path = (out.dir / "stdout.log").string();
  c.stderr_path = (out.dir / "stderr.log").string();
  c.output_cap_bytes = t_.output_cap_bytes;
  c.timeout_s = t_.timeout_s;
  const auto e = run_captured(c);
  out.seconds = e.seconds;
  trainer_seconds_ += e.seconds;
  if (e.output_capped)
    throw std::runtime_error("the " + label + " run printed more than " + std::to_string(t_.output_cap_bytes >> 20) +
                             " MiB (trainer.output_cap_mb); it was stopped: " + join_argv(c.argv));
  if (!e.ok())
    throw std::runtime_error("the " + label + " run " + e.describe() + " (" + join_argv(c.argv) +
                             "): " + stderr_tail(tail_of_file(c.stderr_path, kStderrTailChars)));
  out.metrics = read_metrics(out, vars, c.stdout_path);
  if (t_.probe) {
    refuse_links_to(work_, out.dir / "probe" / "probe.jsonl");
    out.probe = read_probe(out.dir / "probe" / "probe.jsonl");
  }
  return out;
}

fs::path Runner::checkpoint(const RunOut& r, int64_t iterations, int64_t iteration, const fs::path& load_dir) const {
  auto vars = vars_for(r, iterations, load_dir.empty() ? r.save_dir : load_dir);
  vars["iteration"] = std::to_string(iteration);
  fs::path p = expand_placeholders(t_.checkpoint.path, vars);
  if (!p.is_absolute()) p = fs::path(cwd_for(r)) / p;
  refuse_checkpoint_outside(p, r.dir);
  return p;
}

std::map<std::string, std::string> Runner::vars_for(const RunOut& r, int64_t iterations,
                                                    const fs::path& load_dir) const {
  return {{"iterations", std::to_string(iterations)},
          {"save_at", std::to_string(s_.save_at)},
          {"save_dir", r.save_dir.string()},
          {"load_dir", load_dir.string()},
          {"run_dir", r.dir.string()},
          {"tool", o_.tool}};
}

std::string Runner::cwd_for(const RunOut& r) const {
  if (t_.cwd.empty()) return r.dir.string();
  const fs::path c(t_.cwd);
  return (c.is_absolute() ? c : fs::absolute(fs::path(t_.scenario_dir) / c)).lexically_normal().string();
}

MetricLog Runner::read_metrics(const RunOut& r, const std::map<std::string, std::string>& vars,
                               const std::string& stdout_path) {
  if (!t_.metrics.stdout_regex.empty()) {
    refuse_links_to(work_, stdout_path);   // then streamed (its last component opened O_NOFOLLOW)
    return read_stdout_metrics(stdout_path, t_.output_cap_bytes + 1, t_.metrics.stdout_regex);
  }
  fs::path f = expand_placeholders(t_.metrics.file, vars);
  if (!f.is_absolute()) f = fs::path(cwd_for(r)) / f;
  std::error_code ec;
  refuse_links_to(work_, f);
  if (!fs::exists(fs::symlink_status(f, ec)))
    throw std::runtime_error("the " + r.label + " run wrote no metrics file " + f.string() + " (trainer.metrics.file)");
  return read_metrics_file(f.string(), kMaxMetricsFileBytes, t_.metrics.format, /*no_follow=*/true);
}

}   // namespace rh::external
