// The check of an external trainer's cell; see external_check.h. check_external_cell reads as its
// phases: run (every run of the user's command), compare (determinism, the interrupted run, the
// checkpoints, the probe, the resumed run), diagnose, judge, write.
#include "harness/verify/external_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "harness/base/data_files.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/process/process.h"
#include "harness/verify/external_metrics.h"
#include "harness/verify/tensor_compare.h"
#include "harness/verify/writers.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

constexpr uint64_t kMaxProbeBytes = 256ull << 20;
constexpr uint64_t kMaxMetricsFileBytes = 256ull << 20;

// ---- the probe's records (python/rhckpt/probe.py) ----

struct ProbeRecord {
  std::string event;   // "after_load" | "step"
  int64_t iteration = 0;
  std::vector<std::pair<std::string, std::string>> metrics, state;
};

std::vector<std::pair<std::string, std::string>> pairs_of(const nlohmann::json& j, const std::string& where,
                                                          const std::string& field) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!j.is_array()) throw std::invalid_argument(where + ": \"" + field + "\" must be an array of [name, text] pairs");
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
      throw std::invalid_argument(where + ": \"" + field + "\" must be an array of [name, text] pairs");
    out.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
  }
  return out;
}

std::vector<ProbeRecord> read_probe(const fs::path& file) {
  std::vector<ProbeRecord> records;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return records;
  const std::string text = ckpt::read_regular_file(file.string(), kMaxProbeBytes, /*no_follow=*/true);
  size_t line_begin = 0, line = 0;
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = text.size();
    ++line;
    const std::string where = file.string() + ":" + std::to_string(line);
    if (line_end > line_begin) {
      const auto fields = ckpt::parse_json_bounded(text.data() + line_begin, line_end - line_begin, where);
      if (!fields.is_object()) throw std::invalid_argument(where + ": expected a JSON object");
      ProbeRecord record;
      auto event = fields.find("event"), it = fields.find("iteration");
      if (event == fields.end() || !event->is_string() || (*event != "after_load" && *event != "step"))
        throw std::invalid_argument(where + ": \"event\" must be \"after_load\" or \"step\"");
      if (it == fields.end() || !it->is_number_integer())
        throw std::invalid_argument(where + ": \"iteration\" must be an integer");
      record.event = event->get<std::string>();
      record.iteration = it->get<int64_t>();
      if (auto m = fields.find("metrics"); m != fields.end()) record.metrics = pairs_of(*m, where, "metrics");
      if (auto st = fields.find("state"); st != fields.end()) record.state = pairs_of(*st, where, "state");
      records.push_back(std::move(record));
    }
    line_begin = line_end + 1;
  }
  return records;
}

const ProbeRecord* probe_step(const std::vector<ProbeRecord>& records, int64_t iteration) {
  for (const auto& record : records)
    if (record.event == "step" && record.iteration == iteration) return &record;
  return nullptr;
}

// The first key of `got` (in its order) whose text differs from `ref`'s, or is missing there;
// then keys of `ref` that `got` lacks. Keys starting with a skipped prefix are ignored.
std::string first_differing(const std::vector<std::pair<std::string, std::string>>& ref,
                            const std::vector<std::pair<std::string, std::string>>& got,
                            const std::string& skip_prefix = "") {
  std::map<std::string, std::string> ref_values(ref.begin(), ref.end()), got_values(got.begin(), got.end());
  auto skipped = [&](const std::string& key) { return !skip_prefix.empty() && key.rfind(skip_prefix, 0) == 0; };
  for (const auto& [key, value] : got) {
    if (skipped(key)) continue;
    auto it = ref_values.find(key);
    if (it == ref_values.end()) return key + " (only in this run)";
    if (it->second != value) return key;
  }
  for (const auto& [key, value] : ref)
    if (!skipped(key) && !got_values.count(key)) return key + " (missing in this run)";
  return "";
}

// ---- running the trainer ----

struct RunOut {
  std::string label;
  fs::path dir, save_dir;
  MetricLog metrics;
  std::vector<ProbeRecord> probe;
  double seconds = 0;
};

std::string join_argv(const std::vector<std::string>& argv) {
  std::string joined;
  for (const auto& arg : argv) joined += (joined.empty() ? "" : " ") + arg;
  return joined.size() > 300 ? joined.substr(0, 300) + "..." : joined;
}

class Runner {
 public:
  Runner(const Scenario& s, const CheckOptions& o) : s_(s), t_(*s.trainer), o_(o), work_(fs::absolute(o.work_dir)) {}

  // One run: its directory <cell>/<label> (run_dir), save_dir inside it unless given.
  RunOut run(const std::string& label, bool resume, int64_t iterations, const fs::path& load_dir,
             const std::optional<fs::path>& seed_save_dir) {
    RunOut out;
    out.label = label;
    out.dir = work_ / label;
    out.save_dir = out.dir / "save";
    fs::create_directories(out.dir);
    if (seed_save_dir && fs::exists(fs::symlink_status(*seed_save_dir)))
      fs::copy(*seed_save_dir, out.save_dir, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    else fs::create_directories(out.save_dir);
    const auto vars = vars_for(out, iterations, load_dir.empty() ? out.save_dir : load_dir);
    CapturedSpec c;
    for (const auto& a : resume ? t_.resume_command : t_.command) c.argv.push_back(expand_placeholders(a, vars));
    for (const auto& a : t_.args) c.argv.push_back(expand_placeholders(a, vars));
    c.cwd = cwd_for(out);
    for (const auto& [k, v] : t_.env) c.env.emplace_back(k, expand_placeholders(v, vars));
    if (t_.probe) {
      fs::create_directories(out.dir / "probe");
      c.env.emplace_back("RH_PROBE_DIR", (out.dir / "probe").string());
      const std::string py = python_package_dir();
      const char* pp = std::getenv("PYTHONPATH");
      if (!py.empty()) c.env.emplace_back("PYTHONPATH", py + (pp && *pp ? ":" + std::string(pp) : std::string()));
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
                               "): " + ckpt::quote_text(tail_of_file(c.stderr_path, 400), 400));
    out.metrics = read_metrics(out, vars, c.stdout_path);
    if (t_.probe) out.probe = read_probe(out.dir / "probe" / "probe.jsonl");
    return out;
  }

  // The checkpoint a run left for an iteration ("" when the path names none per iteration and
  // `iteration` is not the run's last).
  fs::path checkpoint(const RunOut& r, int64_t iterations, int64_t iteration, const fs::path& load_dir) const {
    auto vars = vars_for(r, iterations, load_dir.empty() ? r.save_dir : load_dir);
    vars["iteration"] = std::to_string(iteration);
    fs::path p = expand_placeholders(t_.checkpoint.path, vars);
    return p.is_absolute() ? p : fs::path(cwd_for(r)) / p;
  }

  double trainer_seconds() const { return trainer_seconds_; }

 private:
  std::map<std::string, std::string> vars_for(const RunOut& r, int64_t iterations, const fs::path& load_dir) const {
    return {{"iterations", std::to_string(iterations)},
            {"save_at", std::to_string(s_.save_at)},
            {"save_dir", r.save_dir.string()},
            {"load_dir", load_dir.string()},
            {"run_dir", r.dir.string()},
            {"tool", o_.tool}};
  }

  std::string cwd_for(const RunOut& r) const {
    if (t_.cwd.empty()) return r.dir.string();
    const fs::path c(t_.cwd);
    return (c.is_absolute() ? c : fs::absolute(fs::path(t_.scenario_dir) / c)).lexically_normal().string();
  }

  MetricLog read_metrics(const RunOut& r, const std::map<std::string, std::string>& vars,
                         const std::string& stdout_path) {
    if (!t_.metrics.stdout_regex.empty())
      return parse_stdout_metrics(ckpt::read_regular_file(stdout_path, t_.output_cap_bytes + 1),
                                  t_.metrics.stdout_regex, "the " + r.label + " run's stdout");
    fs::path f = expand_placeholders(t_.metrics.file, vars);
    if (!f.is_absolute()) f = fs::path(cwd_for(r)) / f;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(f, ec)))
      throw std::runtime_error("the " + r.label + " run wrote no metrics file " + f.string() +
                               " (trainer.metrics.file)");
    return parse_metrics_file(ckpt::read_regular_file(f.string(), kMaxMetricsFileBytes, true), t_.metrics.format,
                              f.string());
  }

  const Scenario& s_;
  const ExternalTrainer& t_;
  const CheckOptions& o_;
  const fs::path work_;
  double trainer_seconds_ = 0;
};

// ---- metrics ----

struct Difference {
  int64_t iteration = std::numeric_limits<int64_t>::max();
  std::string what;
  bool found() const { return !what.empty(); }
  void offer(int64_t it, const std::string& w) {
    if (it < iteration) iteration = it, what = w;
  }
};

// Every row of `got` with an iteration in [lo, hi] against `ref`'s row of the same number;
// differences go to diffs (when given).
Difference compare_rows(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                        std::vector<MetricDiff>* diffs) {
  Difference diff;
  for (const auto& row : got.rows) {
    if (row.iteration < lo || row.iteration > hi) continue;
    const MetricRow* ref_row = ref.find(row.iteration);
    if (!ref_row) {
      diff.offer(row.iteration, "iteration " + std::to_string(row.iteration) + ": not logged by the uninterrupted run");
      continue;
    }
    std::map<std::string, std::string> ref_values(ref_row->values.begin(), ref_row->values.end());
    for (const auto& [name, text] : row.values) {
      auto it = ref_values.find(name);
      if (it == ref_values.end()) {
        diff.offer(row.iteration, "iteration " + std::to_string(row.iteration) + ": metric " + name + " only in the " +
                                      got_name + " run");
        continue;
      }
      MetricDiff metric_diff;
      metric_diff.iteration = row.iteration;
      metric_diff.metric = name;
      metric_diff.baseline = metric_number(it->second);
      metric_diff.resumed = metric_number(text);
      metric_diff.bit_equal = it->second == text;
      metric_diff.abs_diff = metric_diff.bit_equal ? 0 : std::fabs(metric_diff.baseline - metric_diff.resumed);
      if (std::isnan(metric_diff.abs_diff)) metric_diff.abs_diff = std::numeric_limits<double>::infinity();
      metric_diff.rel_diff = metric_diff.baseline != 0 ? metric_diff.abs_diff / std::fabs(metric_diff.baseline)
                                                       : (metric_diff.abs_diff == 0 ? 0 : INFINITY);
      metric_diff.ulp = metric_diff.bit_equal ? 0 : ulp_distance(metric_diff.baseline, metric_diff.resumed);
      if (!metric_diff.bit_equal)
        diff.offer(row.iteration, "iteration " + std::to_string(row.iteration) + ": metric " + name + " (" +
                                      it->second + " vs " + text + ")");
      if (diffs) diffs->push_back(metric_diff);
    }
  }
  return diff;
}

// The rows of `ref` in [lo, hi] that `got` does not log, folded into d (the earliest wins).
void offer_missing(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                   Difference& diff) {
  for (const auto& row : ref.rows)
    if (row.iteration >= lo && row.iteration <= hi && !got.find(row.iteration))
      diff.offer(row.iteration,
                 "iteration " + std::to_string(row.iteration) + ": not logged by the " + got_name + " run");
}

// The probe's step records of `got` in [lo, hi] against `ref`'s.
Difference compare_probe_steps(const std::vector<ProbeRecord>& ref, const std::vector<ProbeRecord>& got, int64_t lo,
                               int64_t hi) {
  Difference diff;
  for (const auto& record : got) {
    if (record.event != "step" || record.iteration < lo || record.iteration > hi) continue;
    const ProbeRecord* ref_record = probe_step(ref, record.iteration);
    if (!ref_record) continue;   // rows missing are the metrics' business
    std::string key = first_differing(ref_record->metrics, record.metrics);
    if (key.empty()) key = first_differing(ref_record->state, record.state);
    if (!key.empty()) diff.offer(record.iteration, "iteration " + std::to_string(record.iteration) + ": " + key);
  }
  return diff;
}

// ---- checkpoints ----

// Regular files under a directory (relative path -> absolute), refusing symbolic links.
std::map<std::string, fs::path> files_under(const fs::path& dir) {
  std::map<std::string, fs::path> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const auto st = it->symlink_status();
    if (fs::is_symlink(st)) throw ckpt::CheckpointError(it->path().string() + ": is a symbolic link; not followed");
    if (fs::is_regular_file(st)) out[fs::relative(it->path(), dir).string()] = it->path();
  }
  return out;
}

// True when the two paths hold the same bytes (the same file names under directories).
bool byte_identical(const fs::path& a, const fs::path& b) {
  if (fs::is_directory(a) != fs::is_directory(b)) return false;
  std::map<std::string, fs::path> fa, fb;
  if (fs::is_directory(a)) fa = files_under(a), fb = files_under(b);
  else fa[""] = a, fb[""] = b;
  if (fa.size() != fb.size()) return false;
  for (const auto& [k, p] : fa) {
    auto it = fb.find(k);
    if (it == fb.end()) return false;
    uint64_t sa = 0, sb = 0;
    if (fs::file_size(p) != fs::file_size(it->second)) return false;
    if (ckpt::xxh3_file(p.string(), &sa) != ckpt::xxh3_file(it->second.string(), &sb)) return false;
  }
  return true;
}

bool torch_like(const fs::path& p) {
  static const char* exts[] = {".pt", ".pth", ".bin", ".ckpt", ".distcp", ".pkl"};
  const std::string e = p.extension().string();
  for (const char* x : exts)
    if (e == x) return true;
  return false;
}

// A checkpoint read key by key: tensors, and everything else as exact text (leaves).
struct Flat {
  TensorMap tensors;
  std::map<std::string, std::string> leaves;
  std::vector<ckpt::SafetensorsFile> files;   // keep the mappings the tensors alias alive
};

void add_safetensors(Flat& f, const fs::path& file, const std::string& prefix) {
  auto st = ckpt::SafetensorsFile::open(file.string());
  if (st.compressed()) st = st.decoded();
  const bool bridged = st.metadata().count("rh_bridge") != 0;
  for (const auto& t : st.tensors()) f.tensors[prefix + t.key] = {t.dtype, st.tensor(t.key)};
  for (const auto& [k, v] : st.metadata()) {
    if (bridged && k.rfind("leaf:", 0) == 0) f.leaves[prefix + k.substr(5)] = v;
    else if (bridged && k.rfind("dtype:", 0) == 0) f.leaves[prefix + k.substr(6) + " (dtype)"] = v;
    else if (!bridged) f.leaves[prefix + "__metadata__/" + k] = v;
  }
  f.files.push_back(std::move(st));
}

// How the bridge is started: `python3 -I -c kBridgeLauncher PATHS ARGS...`. -I (isolated) keeps
// the current directory, the script directory and PYTHON* variables off sys.path, so a json.py
// where the tool was started is never imported; the launcher puts PATHS (colon-separated) first
// on sys.path and runs rhckpt.torch_bridge. Kept equal to torch_bridge.LAUNCHER.
const char* const kBridgeLauncher =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; import runpy; "
    "runpy.run_module('rhckpt.torch_bridge', run_name='__main__', alter_sys=True)";

// One long-lived `torch_bridge --serve` per tool process, shared by every cell (and worker thread):
// importing torch costs about 1.5 s of CPU, a conversion of our example's checkpoint 0.05 s.
// Requests go over a socketpair (send with MSG_NOSIGNAL: a bridge that died cannot kill us with
// SIGPIPE); a bridge that dies, hangs past the timeout or answers garbage is killed and restarted
// on the next request, and the request fails with a message naming the input.
class BridgeServer {
 public:
  static BridgeServer& instance() {
    static BridgeServer s;
    return s;
  }
  // "" on success, else the bridge's one-line error. Every path below `root` is opened by the
  // bridge one component at a time without following links (a link a trainer planted is refused).
  std::string convert(const std::vector<std::pair<fs::path, fs::path>>& io, const fs::path& root, double timeout_s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (pid_ <= 0) start();
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& [in, out] : io)
      paths.push_back(fs::absolute(in).string()), paths.push_back(fs::absolute(out).string());
    const nlohmann::json req = {{"root", fs::absolute(root).string()}, {"io", paths}};
    const std::string line = req.dump() + "\n";
    for (size_t done = 0; done < line.size();) {
      const ssize_t n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return fail("the torch bridge stopped accepting requests");
      done += static_cast<size_t>(n);
    }
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
    std::string reply;
    char buf[4096];
    while (reply.find('\n') == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0)
        return fail("the torch bridge did not answer within " + std::to_string(static_cast<int>(timeout_s)) + " s");
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return fail("the torch bridge ended (killed, or out of memory?)");
      reply.append(buf, static_cast<size_t>(n));
      if (reply.size() > (1u << 20)) return fail("the torch bridge answered more than 1 MiB");
    }
    try {
      const auto j = nlohmann::json::parse(reply.substr(0, reply.find('\n')));
      if (j.at("ok").get<bool>()) return "";
      return j.at("error").get<std::string>();
    } catch (const std::exception&) {
      return fail("the torch bridge answered something that is not its reply");
    }
  }

 private:
  BridgeServer() = default;
  ~BridgeServer() { stop(); }

  std::string fail(const std::string& what) {
    stop();
    return what;
  }

  void start() {
    const std::string py = python_package_dir();
    if (py.empty())
      throw std::runtime_error("python/rhckpt not found (set RH_PYTHON_DIR to the repository's python/ directory)");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
    std::vector<std::string> argv = {python_interpreter(), "-I", "-c", kBridgeLauncher, py, "--serve"};
    std::vector<std::string> env_strings = child_environment({{"PYTHONPATH", py}, {"OMP_NUM_THREADS", "1"}});
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(sv[0]), ::close(sv[1]);
      if (devnull >= 0) ::close(devnull);
      throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // No PR_SET_PDEATHSIG: it fires when the forking *thread* ends, and a matrix worker that
      // started the bridge may end while another still converts. The bridge ends at EOF on its
      // socket instead, which comes when this process exits or dies.
      ::dup2(sv[1], 0);
      ::dup2(sv[1], 1);
      if (devnull >= 0) ::dup2(devnull, 2);
      ::execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    ::close(sv[1]);
    if (devnull >= 0) ::close(devnull);
    fd_ = sv[0];
    pid_ = pid;
  }

  void stop() {
    if (fd_ >= 0) ::close(fd_), fd_ = -1;
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::mutex mu_;
  pid_t pid_ = -1;
  int fd_ = -1;
};

class CheckpointReader {
 public:
  CheckpointReader(const ExternalTrainer& t, fs::path scratch) : t_(t), scratch_(std::move(scratch)) {}

  // Reads checkpoints (files or directories) by their format; every torch one through one start
  // of the bridge (importing torch is most of its cost).
  std::vector<Flat> read(const std::vector<fs::path>& paths, const std::string& label) {
    std::vector<Flat> out(paths.size());
    std::vector<std::pair<fs::path, fs::path>> bridged;   // input -> flat safetensors
    std::vector<size_t> bridged_index;
    for (size_t i = 0; i < paths.size(); ++i) {
      const fs::path& p = paths[i];
      const bool dir = fs::is_directory(fs::symlink_status(p));
      if (format_of(p, dir) == "torch") {
        bridged.emplace_back(p, scratch_ / (label + "_" + std::to_string(i) + ".safetensors"));
        bridged_index.push_back(i);
      } else if (!dir) {
        add_safetensors(out[i], p, "");
      } else {
        for (const auto& [rel, abs] : files_under(p)) {
          if (abs.extension() == ".safetensors") {
            add_safetensors(out[i], abs, rel + "/");
          } else {
            uint64_t size = 0;
            out[i].leaves[rel + " (file bytes)"] =
                ckpt::hex64(ckpt::xxh3_file(abs.string(), &size)) + " " + std::to_string(size);
          }
        }
      }
    }
    if (!bridged.empty()) bridge(bridged, label);
    for (size_t k = 0; k < bridged.size(); ++k) add_safetensors(out[bridged_index[k]], bridged[k].second, "");
    return out;
  }

 private:
  std::string format_of(const fs::path& p, bool dir) const {
    if (t_.checkpoint.format != "auto") return t_.checkpoint.format;
    bool torch = !dir && p.extension() != ".safetensors";
    if (dir)
      for (const auto& [rel, abs] : files_under(p)) torch = torch || torch_like(abs);
    return torch ? "torch" : "safetensors";
  }

  // The root the bridge walks beneath: the directory above the cell (scratch_ is <cell>/flat), so
  // that a link planted in place of the cell or `flat` is met, not followed.
  fs::path bridge_root() const { return fs::absolute(scratch_).parent_path().parent_path(); }

  void bridge(const std::vector<std::pair<fs::path, fs::path>>& io, const std::string& label) {
    if (!t_.checkpoint.trust_pickle) {   // trusted pickles run code: in a process of their own
      // (no create_directories here: it would follow a planted link; the bridge makes `flat`)
      const std::string err = BridgeServer::instance().convert(io, bridge_root(), 600);
      if (!err.empty()) throw ckpt::CheckpointError("cannot read torch checkpoint: " + ckpt::quote_text(err, 500));
      return;
    }
    const std::string py = python_package_dir();
    if (py.empty())
      throw std::runtime_error("cannot read torch checkpoint " + io.front().first.string() +
                               ": python/rhckpt not found (set RH_PYTHON_DIR to the repository's python/ directory)");
    fs::create_directories(scratch_);
    CapturedSpec c;
    // Isolated too; a trusted pickle's classes are imported from the tool's PYTHONPATH, never cwd.
    const char* pp = std::getenv("PYTHONPATH");
    c.argv = {python_interpreter(), "-I", "-c", kBridgeLauncher, py + (pp && *pp ? ":" + std::string(pp) : std::string()),
              "--trust-pickle", "--root", bridge_root().string()};
    for (const auto& [in, out] : io) {
      c.argv.push_back(fs::absolute(in).string());
      c.argv.push_back(fs::absolute(out).string());
    }
    c.env = {{"OMP_NUM_THREADS", "1"}};
    c.stdout_path = (scratch_ / (label + ".bridge.out")).string();
    c.stderr_path = (scratch_ / (label + ".bridge.err")).string();
    c.timeout_s = 600;
    const auto e = run_captured(c);
    if (!e.ok()) {
      std::string msg = tail_of_file(c.stderr_path, 600);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r')) msg.pop_back();
      throw ckpt::CheckpointError("cannot read torch checkpoint: " +
                                  (msg.empty() ? "the bridge " + e.describe() : ckpt::quote_text(msg, 500)));
    }
  }

  const ExternalTrainer& t_;
  fs::path scratch_;
};

// "" when identical, else the first differing key; diffs (when given) get every tensor's row.
std::string compare_checkpoints(CheckpointReader& reader, const fs::path& a, const fs::path& b,
                                const std::string& label, std::vector<TensorDiff>* diffs) {
  for (const auto* p : {&a, &b})
    if (!fs::exists(fs::symlink_status(*p)))
      throw std::runtime_error("checkpoint " + p->string() + " was not written (trainer.checkpoint.path)");
  if (byte_identical(a, b)) return "";
  const auto flat = reader.read({a, b}, label);
  const Flat &fa = flat[0], &fb = flat[1];
  auto td = compare_tensor_maps(fa.tensors, fb.tensors);
  std::set<std::string> keys;
  for (const auto& [k, v] : fa.leaves) keys.insert(k);
  for (const auto& [k, v] : fb.leaves) keys.insert(k);
  for (const auto& k : keys) {
    TensorDiff d;
    d.key = k;
    d.kind = "leaf";
    auto ia = fa.leaves.find(k), ib = fb.leaves.find(k);
    d.dtype_a = ia != fa.leaves.end() ? "text" : "";
    d.dtype_b = ib != fb.leaves.end() ? "text" : "";
    d.numel = 1;
    d.shape_equal = true;
    d.bit_equal_fraction = (ia != fa.leaves.end() && ib != fb.leaves.end() && ia->second == ib->second) ? 1.0 : 0.0;
    if (d.bit_equal_fraction < 1) d.max_abs_diff = std::numeric_limits<double>::infinity();
    td.push_back(d);
  }
  std::sort(td.begin(), td.end(), [](const TensorDiff& x, const TensorDiff& y) { return x.key < y.key; });
  std::string first;
  for (const auto& d : td)
    if (!d.identical() && first.empty())
      first = d.key + (d.dtype_a.empty()   ? " (missing in the first)"
                       : d.dtype_b.empty() ? " (missing in the second)"
                                           : "");
  // Files that differ in bytes with every key equal (a zip's record names, a pickle's memo order)
  // hold the same checkpoint.
  if (diffs) *diffs = td;
  return first;
}

// ---- the cell ----

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

void resolution_notes(const MetricLog& log, bool bitwise_elsewhere, std::vector<std::string>& notes) {
  for (const auto& [name, res] : log.resolution)
    if (!res.empty())
      notes.push_back(name + " printed with " + res + " here" +
                      (bitwise_elsewhere ? "; the checkpoint/probe comparison is bitwise"
                                         : "; nothing else is compared bitwise (add trainer.checkpoint or the probe)"));
}

void diagnose(CheckResult& result, const std::string& code, const std::string& where, const std::string& words) {
  if (!result.diagnosis.empty() && result.diagnosis != "none") return;   // the first in order stays
  result.diagnosis = code;
  result.first_divergence = where;
  result.explanation = words;
}

void run_cell(const Scenario& scenario, const CheckOptions& opts, CheckResult& result, Runner& run) {
  const ExternalTrainer& trainer = *scenario.trainer;
  const int64_t K = scenario.save_at, N = scenario.cfg.train.iterations;
  const bool ckpts = !trainer.checkpoint.path.empty();
  const bool per_iteration = trainer.checkpoint.path.find("{iteration") != std::string::npos;
  CheckpointReader reader(trainer, fs::path(opts.work_dir) / "flat");

  // 1. Determinism: the uninterrupted run, determinism_runs times.
  std::vector<RunOut> uninterrupted_runs;
  for (int d = 1; d <= trainer.determinism_runs; ++d)
    uninterrupted_runs.push_back(run.run("uninterrupted_" + std::to_string(d), false, N, {}, std::nullopt));
  const RunOut& uninterrupted = uninterrupted_runs.front();
  if (uninterrupted.metrics.rows.empty())
    throw std::runtime_error("the uninterrupted run logged no metric rows (trainer.metrics matched nothing in " +
                             (uninterrupted.dir / "stdout.log").string() + ")");
  for (size_t d = 1; d < uninterrupted_runs.size(); ++d) {
    const std::string name = uninterrupted_runs[d].label;
    constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    Difference diff = compare_rows(uninterrupted.metrics, uninterrupted_runs[d].metrics, lo, hi, name, nullptr);
    offer_missing(uninterrupted.metrics, uninterrupted_runs[d].metrics, lo, hi, name, diff);
    Difference probe_diff = compare_probe_steps(uninterrupted.probe, uninterrupted_runs[d].probe, 0, N);
    if (probe_diff.found() && probe_diff.iteration <= diff.iteration) diff = probe_diff;
    std::string key;
    const fs::path ckpt_first = ckpts ? run.checkpoint(uninterrupted, N, N, {}) : fs::path(),
                   ckpt_other = ckpts ? run.checkpoint(uninterrupted_runs[d], N, N, {}) : fs::path();
    if (!diff.found() && ckpts && present(ckpt_first) && present(ckpt_other))
      key = compare_checkpoints(reader, ckpt_first, ckpt_other, "determinism", nullptr);
    if (diff.found() || !key.empty()) {
      result.outcome = Outcome::nondeterministic;
      const std::string where = diff.found() ? diff.what : "final checkpoint: " + key;
      diagnose(result, "nondeterministic", "uninterrupted runs differ: " + where,
               "two uninterrupted runs of the same command differ (" + where +
                   "): the trainer is not reproducible, so resume is not judged. Seed every RNG, use deterministic "
                   "algorithms, and pin threads (e.g. --deterministic-mode, CUBLAS_WORKSPACE_CONFIG, one data-loader "
                   "order)");
      return;
    }
  }
  // Controls: the comparison can fail (the metrics change over iterations), and the resumed run
  // is compared on at least one iteration after K (checked below).
  for (const auto& row : uninterrupted.metrics.rows)
    if (row.values != uninterrupted.metrics.rows.front().values) result.control_k_differs = true;

  // 2. The interrupted run: every row up to K must equal the uninterrupted run's.
  RunOut interrupted = run.run("interrupted", false, K, {}, std::nullopt);
  {
    Difference diff = compare_rows(uninterrupted.metrics, interrupted.metrics, std::numeric_limits<int64_t>::min(), K,
                                   "interrupted", nullptr);
    offer_missing(uninterrupted.metrics, interrupted.metrics, std::numeric_limits<int64_t>::min(), K, "interrupted",
                  diff);
    Difference probe_diff =
        compare_probe_steps(uninterrupted.probe, interrupted.probe, std::numeric_limits<int64_t>::min(), K);
    if (probe_diff.found() && probe_diff.iteration <= diff.iteration) diff = probe_diff;
    if (diff.found())
      diagnose(result, "before-save", "interrupted run: " + diff.what,
               "the interrupted run ({iterations} = " + std::to_string(K) +
                   ") differs from the uninterrupted run before "
                   "any save (" +
                   diff.what +
                   "): its computation depends on the number of iterations it is given (e.g. an LR "
                   "schedule over --iters; give the schedule its own length and stop with an exit interval) or on the "
                   "save itself");
  }

  // 3. The saved state at K against the uninterrupted run's.
  bool saved_state_known_equal = false;
  const fs::path saved_at_k = ckpts ? run.checkpoint(interrupted, K, K, {}) : fs::path();
  if (ckpts && !present(saved_at_k))
    throw std::runtime_error("checkpoint " + saved_at_k.string() +
                             " was not written by the interrupted run (trainer.checkpoint.path)");
  if (ckpts && per_iteration && !present(run.checkpoint(uninterrupted, N, K, {})))
    result.notes.push_back("the saved state at K was not compared: the uninterrupted run left no " +
                           run.checkpoint(uninterrupted, N, K, {}).string());
  else if (ckpts && per_iteration) {
    const std::string key = compare_checkpoints(reader, run.checkpoint(uninterrupted, N, K, {}), saved_at_k,
                                                "saved_at_k", &result.after_load);
    if (!key.empty())
      diagnose(result, "saved-state", "saved state at " + std::to_string(K) + ": " + key,
               "the checkpoint the interrupted run saved at " + std::to_string(K) +
                   " differs from the one the uninterrupted "
                   "run saved at " +
                   std::to_string(K) + " (first key " + key + "): what is saved depends on stopping there");
    else saved_state_known_equal = true;
  }

  // 4. The round trip: load K, train nothing, save.
  if (trainer.round_trip) {
    RunOut round_trip = run.run("round_trip", true, K, interrupted.save_dir, interrupted.save_dir);
    const std::string key =
        compare_checkpoints(reader, saved_at_k, run.checkpoint(round_trip, K, K, interrupted.save_dir), "round_trip",
                            nullptr);
    if (!key.empty())
      diagnose(result, "round-trip", "round trip: " + key,
               "loading the checkpoint at " + std::to_string(K) + " and saving it again without training changes " +
                   key + ": the load (or the save) does not restore that state exactly");
  }

  // 5. The resumed run; its state right after load (probe).
  RunOut resumed = run.run("resumed", true, N, interrupted.save_dir, interrupted.save_dir);
  if (trainer.probe) {
    const ProbeRecord* loaded = nullptr;
    for (const auto& record : resumed.probe)
      if (record.event == "after_load") loaded = &record;
    const ProbeRecord* at_k = probe_step(uninterrupted.probe, K);
    if (!loaded || !at_k)
      throw std::runtime_error(std::string("trainer.probe = true but ") +
                               (!loaded
                                    ? "the resumed run recorded no probe.after_load"
                                    : "the uninterrupted run recorded no probe.after_step at " + std::to_string(K)) +
                               " (is RH_PROBE_DIR reaching the trainer, and does it call the probe?)");
    std::string key = loaded->iteration != K ? "iteration (restored " + std::to_string(loaded->iteration) + ")" : "";
    if (key.empty()) key = first_differing(at_k->state, loaded->state, "data/");
    if (!key.empty())
      diagnose(result, "after-load", "after load: " + key,
               "the state right after loading differs from the uninterrupted run's state at " + std::to_string(K) +
                   " (first " + key +
                   "): it is not saved, or not restored, or restored and then changed (e.g. a re-seed)");
    else saved_state_known_equal = true;
  }
  Difference diff = compare_rows(uninterrupted.metrics, resumed.metrics, std::numeric_limits<int64_t>::min(), N,
                                 "resumed", &result.metric_diffs);
  offer_missing(uninterrupted.metrics, resumed.metrics, K + 1, N, "resumed", diff);
  for (const auto& row : resumed.metrics.rows)
    result.control_fresh_differs = result.control_fresh_differs || (row.iteration > K && row.iteration <= N);
  Difference probe_diff = compare_probe_steps(uninterrupted.probe, resumed.probe, K + 1, N);
  std::string where = diff.found() ? diff.what : "";
  if (probe_diff.found() && probe_diff.iteration <= diff.iteration) where = probe_diff.what;
  for (const auto& metric_diff : result.metric_diffs)
    if (metric_diff.metric == "loss" || metric_diff.metric == "lm_loss" || metric_diff.metric == "lm loss")
      result.max_abs_dloss = std::max(result.max_abs_dloss, metric_diff.abs_diff);
  if (!where.empty()) {
    if (saved_state_known_equal)
      diagnose(result, "not-in-checkpoint", where,
               where +
                   " while the saved state is identical: what differs is not in the checkpoint: data order, RNG "
                   "streams, or a schedule derived from the process start");
    else
      diagnose(result, "resumed-metrics", where,
               where + " after resume" +
                   (ckpts
                        ? ""
                        : "; only the logged metrics were compared (add trainer.checkpoint or the probe to localize)"));
  }

  // 6. The final state.
  const fs::path final_uninterrupted = ckpts ? run.checkpoint(uninterrupted, N, N, {}) : fs::path();
  if (ckpts && !present(final_uninterrupted))
    result.notes.push_back("the final state was not compared: the uninterrupted run left no " +
                           final_uninterrupted.string());
  else if (ckpts) {
    const std::string key =
        compare_checkpoints(reader, final_uninterrupted, run.checkpoint(resumed, N, N, interrupted.save_dir), "final",
                            &result.final_state);
    if (!key.empty())
      diagnose(result, "final-state", "final state: " + key,
               "every compared metric is equal but the final checkpoint differs at " + key +
                   ": a state that does not "
                   "(yet) reach the logged metrics was not resumed exactly");
  }
  resolution_notes(uninterrupted.metrics, ckpts || trainer.probe, result.notes);
  if (result.diagnosis.empty()) {
    result.diagnosis = "none";
    result.explanation = "every logged metric" + std::string(ckpts ? ", every checkpoint key" : "") +
                         (trainer.probe ? " and every probed state" : "") +
                         " of the resumed run equals the uninterrupted run's";
  }
  if (result.outcome != Outcome::nondeterministic)
    result.outcome = result.diagnosis == "none" ? Outcome::identical : Outcome::diverged;
}

}   // namespace

std::string python_package_dir() {
  if (const char* e = std::getenv("RH_PYTHON_DIR"); e && *e) return e;
  // Beside the tool with its other data files, in a build tree as in an install.
  const std::string data = data_dir();
  std::error_code ec;
  if (data.empty() || !fs::is_directory(fs::path(data) / "python" / "rhckpt", ec)) return "";
  return (fs::path(data) / "python").string();
}

std::string python_interpreter() {
  if (const char* e = std::getenv("RH_PYTHON"); e && *e) return e;
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

CheckResult check_external_cell(const Scenario& scenario, const CheckOptions& opts) {
  CheckResult result;
  result.name = scenario.name;
  result.expectation = to_string(scenario.expect.kind);
  const auto t0 = std::chrono::steady_clock::now();
  Runner run(scenario, opts);
  try {
    run_cell(scenario, opts, result, run);
  } catch (const ckpt::CheckpointError& e) {   // a checkpoint the trainer wrote is unreadable or hostile
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
    result.bad_input = true;
  } catch (const std::invalid_argument& e) {   // its log, metrics file or probe records are malformed
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
    result.bad_input = true;
  } catch (const std::exception& e) {
    result.outcome = Outcome::error;
    result.diagnosis = "";
    result.first_divergence = e.what();
  }
  result.trainer_seconds = run.trainer_seconds();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  judge(scenario, result);
  if (!opts.keep_checkpoints) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(opts.work_dir, ec))
      if (entry.is_directory() && !fs::is_symlink(entry.symlink_status())) fs::remove_all(entry.path() / "save", ec);
    fs::remove_all(fs::path(opts.work_dir) / "flat", ec);
  }
  try {
    write_cell_outputs(opts.work_dir, scenario, result);
  } catch (const std::exception& e) {
    result.passed = false;
    result.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return result;
}

}   // namespace rh
