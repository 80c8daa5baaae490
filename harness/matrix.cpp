// The matrix runner; see matrix.h.
#include "harness/matrix.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "harness/env.h"
#include "harness/metrics.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') o += ' ';
        else o += c;
    }
  }
  return o;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}


}  // namespace

std::string scenario_work_dir(const std::filesystem::path& run_dir, const std::string& scenario) {
  const fs::path parent = run_dir / "scenarios";
  const fs::path dir = parent / safe_name(scenario);
  // safe_name guarantees this; checked again because the directory is removed before each run.
  if (dir.parent_path() != parent || dir.filename() == "." || dir.filename() == ".." || dir.filename().empty())
    throw std::logic_error("scenario directory " + dir.string() + " is not a child of " + parent.string());
  return dir.string();
}

std::string compare_golden(const std::string& golden_csv, const std::string& actual_csv) {
  const auto g = read_metrics_csv(golden_csv), a = read_metrics_csv(actual_csv);
  if (g.size() != a.size())
    return "golden has " + std::to_string(g.size()) + " rows, run has " + std::to_string(a.size());
  for (size_t i = 0; i < g.size(); ++i)
    for (const auto& name : metric_names()) {
      const double x = metric_value(g[i], name), y = metric_value(a[i], name);
      if (std::memcmp(&x, &y, sizeof x) != 0)
        return "iteration " + std::to_string(g[i].iteration) + ": " + name + " golden " + hex_float(x) +
               " vs run " + hex_float(y);
    }
  return "";
}

void write_junit(const std::string& path, const std::string& suite, const std::vector<CheckResult>& results) {
  size_t failures = 0;
  double total = 0;
  for (const auto& r : results) {
    failures += r.passed ? 0 : 1;
    total += r.seconds;
  }
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += "<testsuites tests=\"" + std::to_string(results.size()) + "\" failures=\"" + std::to_string(failures) + "\">\n";
  x += "  <testsuite name=\"" + xml_escape(suite) + "\" tests=\"" + std::to_string(results.size()) +
       "\" failures=\"" + std::to_string(failures) + "\" errors=\"0\" time=\"" + exact_decimal(total) + "\">\n";
  for (const auto& r : results) {
    x += "    <testcase classname=\"" + xml_escape(suite) + "\" name=\"" + xml_escape(r.name) + "\" time=\"" +
         exact_decimal(r.seconds) + "\"";
    if (r.passed) {
      x += "/>\n";
    } else {
      x += ">\n      <failure message=\"" + xml_escape(r.verdict) + "\">" + xml_escape(r.verdict) +
           "</failure>\n    </testcase>\n";
    }
  }
  x += "  </testsuite>\n</testsuites>\n";
  std::ofstream f(path, std::ios::trunc);
  f << x;
  if (!f) throw std::runtime_error("cannot write " + path);
}

MatrixResult run_matrix(const MatrixOptions& o, std::ostream& log) {
  auto all = load_scenarios(o.file);
  auto sel = select_scenarios(all, o.filter);
  if (sel.empty()) throw std::invalid_argument(o.file + ": no scenario matches '" + o.filter + "'");
  const fs::path run_dir = o.run_dir.empty() ? fs::path("reports/runs") / fs::path(o.file).stem() : fs::path(o.run_dir);
  fs::create_directories(run_dir / "scenarios");
  if (!o.golden_dir.empty()) fs::create_directories(o.golden_dir);

  MatrixResult out;
  out.results.resize(sel.size());
  std::atomic<size_t> next{0}, done{0};
  std::mutex mu;
  std::vector<std::string> running(static_cast<size_t>(std::max(1, o.jobs)));
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto status = [&](const std::string& line) {  // called with mu held
    if (o.progress_tty) log << "\r\033[K" << line << std::flush;
    else log << line << "\n" << std::flush;
  };
  auto progress_line = [&](const std::string& current) {
    const double e = elapsed();
    const size_t d = done.load();
    const double eta = d ? e / static_cast<double>(d) * static_cast<double>(sel.size() - d) : 0;
    return "[" + std::to_string(d) + "/" + std::to_string(sel.size()) + "] elapsed " + fmt_seconds(e) +
           (d ? ", ETA " + fmt_seconds(eta) : std::string()) + " | " + current;
  };

  auto worker = [&](size_t slot) {
    while (true) {
      const size_t i = next++;
      if (i >= sel.size()) return;
      const auto& s = sel[i];
      {
        std::lock_guard<std::mutex> lk(mu);
        running[slot] = s.name;
        status(progress_line("running " + s.name));
      }
      CheckOptions co;
      co.tool = o.tool;
      co.work_dir = scenario_work_dir(run_dir, s.name);
      co.keep_checkpoints = o.keep_checkpoints;
      auto r = run_check(s, co);
      if (!o.golden_dir.empty() && r.outcome != "error") {
        const fs::path golden = fs::path(o.golden_dir) / (safe_name(s.name) + ".csv");
        const fs::path actual = fs::path(co.work_dir) / "baseline" / "metrics.csv";
        try {
          if (o.update_golden) {
            fs::copy_file(actual, golden, fs::copy_options::overwrite_existing);
          } else if (!fs::exists(golden)) {
            r.passed = false;
            r.verdict = "FAIL: no golden metrics " + golden.string() + " (run with --update-golden)";
          } else if (auto diff = compare_golden(golden.string(), actual.string()); !diff.empty()) {
            r.passed = false;
            r.verdict = "FAIL: baseline differs from golden " + golden.string() + ": " + diff;
          }
        } catch (const std::exception& e) {
          r.passed = false;
          r.verdict = std::string("FAIL: golden comparison: ") + e.what();
        }
      }
      std::lock_guard<std::mutex> lk(mu);
      out.results[i] = r;
      ++done;
      running[slot].clear();
      if (o.progress_tty) log << "\r\033[K";
      log << (r.passed ? "PASS " : "FAIL ") << r.name << "  (" << fmt_seconds(r.seconds) << ")"
          << (r.passed ? "" : "\n     " + r.verdict + "\n     reproduce: resume-harness check --file " + o.file +
                                  " '" + r.name + "'")
          << "\n";
      if (done < sel.size()) status(progress_line("running " + (running[slot].empty() ? std::string("...") : running[slot])));
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < running.size(); ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  if (o.progress_tty) log << "\r\033[K";

  // summary.csv / summary.json / junit.xml
  std::string csv =
      "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
      "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
      "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
      "master_mode,seconds,compress,raw_bytes_per_param\n";
  nlohmann::json js = nlohmann::json::array();
  size_t failed = 0;
  for (size_t i = 0; i < sel.size(); ++i) {
    const auto& r = out.results[i];
    const auto& s = sel[i];
    failed += r.passed ? 0 : 1;
    auto ulp = [&](const char* k) {
      auto it = r.max_ulp_after_load.find(k);
      return it == r.max_ulp_after_load.end() ? std::string("") : std::to_string(it->second);
    };
    const auto mode = optim::effective_master_mode(
        s.cfg.optim, s.cfg.model.param_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
    csv += csv_field(r.name) + "," + r.expectation + "," + (r.passed ? "1" : "0") + "," + r.outcome + "," +
           csv_field(r.verdict) + "," + csv_field(r.first_divergence) + "," + exact_decimal(r.max_abs_dloss) + "," +
           ulp("model") + "," + ulp("master_param") + "," + ulp("remainder") + "," + ulp("exp_avg") + "," +
           ulp("exp_avg_sq") + "," + ulp("scale") + "," + std::to_string(r.checkpoint_bytes) + "," +
           exact_decimal(r.bytes_per_param) + "," + std::to_string(r.num_params) + "," + ckpt::to_string(s.policy.kind) + "," +
           to_string(s.fault) + "," + optim::to_string(s.cfg.optim.exp_avg_dtype) + "," +
           optim::to_string(s.cfg.optim.exp_avg_sq_dtype) + "," + optim::to_string(mode) + "," + exact_decimal(r.seconds) + "," +
           ckpt::to_string(s.policy.compress) + "," + exact_decimal(r.raw_bytes_per_param) + "\n";
    nlohmann::json one = nlohmann::json::parse(
        std::ifstream(run_dir / "scenarios" / safe_name(r.name) / "result.json"), nullptr, false);
    if (one.is_discarded()) one = {{"name", r.name}};
    one["passed"] = r.passed;
    one["verdict"] = r.verdict;
    one["dir"] = (fs::path("scenarios") / safe_name(r.name)).string();
    js.push_back(one);
  }
  std::ofstream(run_dir / "summary.csv", std::ios::trunc) << csv;
  const auto info = runtime_info();
  nlohmann::json summary = {
      {"file", o.file}, {"filter", o.filter}, {"scenarios", js}, {"failed", failed},
      {"total", sel.size()}, {"seconds", elapsed()},
      {"environment", {{"harness_version", info.harness_version}, {"git_commit", info.git_commit},
                       {"torch_version", info.torch_version}, {"blas", info.blas},
                       {"cuda_compiled", info.cuda_compiled}, {"threads_per_process", sel.front().cfg.train.threads},
                       {"jobs", o.jobs}, {"device", sel.front().cfg.train.device}}}};
  std::ofstream(run_dir / "summary.json", std::ios::trunc) << summary.dump(2) << "\n";
  write_junit((run_dir / "junit.xml").string(), fs::path(o.file).stem().string(), out.results);
  log << (sel.size() - failed) << " passed, " << failed << " failed (" << fmt_seconds(elapsed()) << "), run directory "
      << run_dir.string() << "\n";
  out.exit_code = failed ? 1 : 0;
  return out;
}

}  // namespace rh
