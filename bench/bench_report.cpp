// Benchmark: `resume-harness report` on long matrix summaries, in rows (scenarios) per second
// (100,000 rows once took 326 s). For each N it writes a synthetic run directory and
// times, separately:
//  - the C++ part, in this process: generate_report with the plot script pointed at a path that
//    does not exist, so it writes its tables, plot inputs, report.md and report.html and skips the
//    plots; then its main steps one by one (load_run, fp32_references, ...), so a slow one shows;
//  - the plot step: reports/plots.py on the plot inputs that report wrote (bench/bench_plots.py
//    times the same script on inputs of its own).
// Two shapes of run directory per N: "summary" holds summary.csv and summary.json only (every
// scenario's files missing, as in a run whose cells errored), "files" adds each scenario's CSVs and
// result.json. "files" shares 64 real scenario directories between the N rows (summary.json's
// `dir`), so the disk holds 64 x 6 files whatever N is, while the report still opens and parses
// six files per row.
// Prints figures, never pass/fail on time. The tool's own start-up (LibTorch, the numerics re-exec:
// seconds on a loaded machine) is not in these figures.
//   bench_report [--no-plots] [--timeout S] [--keep DIR] [N ...]     (default N: 1000 10000 100000)
// --timeout bounds plots.py; --keep DIR leaves the run directories there.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "harness/process/process.h"
#include "harness/base/data_files.h"
#include "reports/report_writer.h"
#include "reports/tables.h"

namespace fs = std::filesystem;

namespace {

const char* kPolicies[] = {"fp32", "per_key", "native", "dp_reshardable"};
constexpr size_t kGroups = 8;        // scenario groups g0..g7
constexpr size_t kSharedDirs = 16;   // real scenario directories per policy ("files" shape)

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  if (!f) {
    std::fprintf(stderr, "bench_report: cannot write %s\n", p.c_str());
    std::exit(2);
  }
}

// Scenario i: group g = i % 8, its k-th member (k = i / 8) has seed k / 4 and policy k % 4, so each
// group's outcome grid is (N / 32 seeds) x (4 policies) and every seed of a group is one run
// configuration measured under the four save policies (one fp32 reference per configuration).
struct Synth {
  std::string name, group, policy, dir;
  size_t policy_index = 0, seed = 0;
};

Synth scenario(size_t i) {
  Synth s;
  const size_t g = i % kGroups, k = i / kGroups;
  s.group = "g" + std::to_string(g);
  s.seed = k / 4;
  s.policy_index = k % 4;
  s.policy = kPolicies[s.policy_index];
  s.name = s.group + "/seed=" + std::to_string(s.seed) + ",policy=" + s.policy;
  s.dir = "scenarios/shared_" + s.policy + "_" + std::to_string(i % kSharedDirs);
  return s;
}

std::string moments_dtype(size_t policy_index) { return policy_index == 0 || policy_index == 3 ? "F32" : "BF16"; }

std::string disk_csv(size_t policy_index) {
  const std::string m = moments_dtype(policy_index), mb = m == "F32" ? "3938816" : "1969408";
  return "file,key,kind,dtype,numel,bytes\n"
         "model.safetensors,w,model,BF16,984704,1969408\n"
         "optim_rank_00000.safetensors,w/master_param,master_param,F32,984704,3938816\n"
         "optim_rank_00000.safetensors,w/exp_avg,exp_avg," +
         m + ",984704," + mb +
         "\n"
         "optim_rank_00000.safetensors,w/exp_avg_sq,exp_avg_sq," +
         m + ",984704," + mb +
         "\n"
         "model.safetensors,<header>,metadata,,0,120\n"
         "optim_rank_00000.safetensors,<header>,metadata,,0,260\n"
         "manifest.json,<manifest>,metadata,,0,2400\n";
}

std::string metrics_csv(int from, int to) {
  std::string s =
      "iteration,consumed_samples,lm_loss,lm_loss_hex,aux_loss,aux_loss_hex,total_loss,"
      "total_loss_hex,grad_norm,grad_norm_hex,lr,lr_hex,num_zeros\n";
  for (int i = from; i <= to; ++i) {
    const double l = 4.0 - i / 8.0;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%d,%d,%.9g,%a,0,0x0p+0,%.9g,%a,1.5,0x1.8p+0,0.01,%a,0\n", i, i * 16, l, l, l, l,
                  0.01);
    s += buf;
  }
  return s;
}

std::string metrics_compare_csv(int from, int to) {
  std::string s = "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n";
  for (int i = from; i <= to; ++i) {
    const double b = 4.0 - i / 8.0;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%d,lm_loss,%.17g,%a,%.17g,%a,0,0,0,1\n", i, b, b, b, b);
    s += buf;
  }
  return s;
}

std::string state_csv(size_t policy_index) {
  const std::string m = moments_dtype(policy_index);
  return "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n"
         "after_load,model/w,model,BF16,BF16,984704,1,0,0\n"
         "after_load,w/master_param,master_param,F32,F32,984704,1,0,0\n"
         "after_load,w/exp_avg,exp_avg," +
         m + "," + m +
         ",984704,1,0,0\n"
         "after_load,w/exp_avg_sq,exp_avg_sq," +
         m + "," + m +
         ",984704,1,0,0\n"
         "final,model/w,model,BF16,BF16,984704,1,0,0\n";
}

std::string config_json(const Synth& s) {
  return R"({"model":{"param_dtype":"bf16","d_model":64},"train":{"iterations":20,"seed":)" + std::to_string(s.seed) +
         R"(,"group":")" + s.group + R"("}})";
}

void write_run(const fs::path& d, size_t n, bool files) {
  std::string csv =
      "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
      "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,checkpoint_bytes,"
      "bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,master_mode,seconds,compress,"
      "raw_bytes_per_param\n";
  std::string json = R"({"file":"scenarios/bench.toml","filter":"","scenarios":[)";
  for (size_t i = 0; i < n; ++i) {
    const Synth s = scenario(i);
    const bool bf16 = moments_dtype(s.policy_index) == "BF16";
    const std::string bytes = bf16 ? "9851904" : "13790720", bpp = bf16 ? "10.0049" : "14.0049";
    std::string row = "\"" + s.name + "\",exact,";
    if (i % 101 == 7) {   // errored: a message with commas, quoted
      row +=
          "0,error,\"FAIL: error: baseline process exited with 134, core dumped\",\"baseline process exited with "
          "134, core dumped\",0,,,,,,,0,0,0," +
          s.policy + ",none,fp32,fp32,fp32,0.5,none,0\n";
    } else if (i % 97 == 3) {   // diverged where a bit-exact resume was expected
      row +=
          "0,diverged,\"FAIL: expected a bit-exact resume: after load: w/exp_avg\",after load: w/exp_avg,"
          "0.0078125,0,0,,3,0,," +
          bytes + "," + bpp + ",984704," + s.policy + ",none,fp32,fp32,fp32,2.5,none," + bpp + "\n";
    } else {
      row += "1,identical,PASS: bit-exact resume,,0,0,0,,0,0,," + bytes + "," + bpp + ",984704," + s.policy +
             ",none,fp32,fp32,fp32,2.0,none," + bpp + "\n";
    }
    csv += row;
    json += std::string(i ? "," : "") + R"({"name":")" + s.name + R"(","dir":")" +
            (files ? s.dir : "scenarios/" + s.group + "__" + std::to_string(i)) + R"(","config":)" + config_json(s) +
            "}";
  }
  json += R"(],"failed":0,"total":)" + std::to_string(n) +
          R"(,"seconds":1.5,"environment":{"harness_version":"0.1.0","git_commit":"bench","torch_version":"1.13.1",)"
          R"("blas":"OpenBLAS","cuda_compiled":false,"threads_per_process":1,"jobs":1,"device":"cpu"}})"
          "\n";
  write(d / "summary.csv", csv);
  write(d / "summary.json", json);
  if (!files) return;
  for (size_t p = 0; p < 4; ++p)
    for (size_t j = 0; j < kSharedDirs && j < n; ++j) {
      const fs::path sd = d / "scenarios" / ("shared_" + std::string(kPolicies[p]) + "_" + std::to_string(j));
      write(sd / "result.json", R"({"save_at":10,"iterations":20})"
                                "\n");
      write(sd / "disk.csv", disk_csv(p));
      write(sd / "state_compare.csv", state_csv(p));
      write(sd / "metrics_compare.csv", metrics_compare_csv(11, 20));
      write(sd / "baseline" / "metrics.csv", metrics_csv(1, 20));
      write(sd / "resumed" / "metrics.csv", metrics_csv(11, 20));
    }
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_rate(const char* what, size_t n, double dt) {
  std::printf("  %-34s %9.3f s  %12.0f rows/s\n", what, dt, static_cast<double>(n) / dt);
  std::fflush(stdout);
}

// The report's C++ part, whole (generate_report, plots skipped), then its main steps on their own
// so a slow one shows which; returns false when the report failed.
bool time_report(const fs::path& d, size_t n) {
  std::ostringstream log;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rh::report::generate_report(d.string(), "", log);
  } catch (const std::exception& e) {
    std::printf("  report failed: %s\n", e.what());
    return false;
  }
  print_rate("report (C++, plots skipped)", n, since(t0));
  auto t = std::chrono::steady_clock::now();
  const auto run = rh::report::load_run(d.string());
  std::printf("    load_run %.3f s", since(t));
  t = std::chrono::steady_clock::now();
  const auto refs = rh::report::fp32_references(run);
  std::printf(", fp32_references %.3f s", since(t));
  t = std::chrono::steady_clock::now();
  const auto combos = rh::report::storage_combos(run, refs);
  std::printf(", storage_combos %.3f s", since(t));
  t = std::chrono::steady_clock::now();
  const auto grids = rh::report::outcome_grids(run);
  std::printf(", outcome_grids %.3f s", since(t));
  t = std::chrono::steady_clock::now();
  const auto table = rh::report::matrix_table(run, refs);
  std::printf(", matrix_table %.3f s", since(t));
  t = std::chrono::steady_clock::now();
  const std::string md = rh::report::to_markdown(table), html = rh::report::to_html(table);
  std::printf(", its Markdown and HTML %.3f s\n", since(t));
  std::fflush(stdout);
  return true;
}

}   // namespace

int main(int argc, char** argv) {
  bool plots = true;
  double timeout_s = 600;
  std::string keep;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-plots") plots = false;
    else if (a == "--timeout" && i + 1 < argc) timeout_s = std::atof(argv[++i]);
    else if (a == "--keep" && i + 1 < argc) keep = argv[++i];
    else if (!a.empty() && a.find_first_not_of("0123456789") == std::string::npos) sizes.push_back(std::stoul(a));
    else {
      std::fprintf(stderr, "usage: bench_report [--no-plots] [--timeout S] [--keep DIR] [N ...]\n");
      return 2;
    }
  }
  if (sizes.empty()) sizes = {1000, 10000, 100000};
  const char* env_script = std::getenv("RH_PLOTS_SCRIPT");
  const std::string script = env_script && *env_script ? env_script : rh::data_file("reports/plots.py");
  const char* env_py = std::getenv("RH_PYTHON");
  const std::string python = env_py && *env_py ? env_py : "/usr/bin/python3";
  // The report skips its plots (a script that does not exist): the plot step is timed on its own.
  setenv("RH_PLOTS_SCRIPT", "/nonexistent/bench_report/plots.py", 1);
  const fs::path base =
      keep.empty() ? fs::temp_directory_path() / ("rh_bench_report_" + std::to_string(getpid())) : fs::path(keep);
  for (size_t n : sizes)
    for (bool files : {false, true}) {
      const fs::path d = base / ((files ? "files_" : "summary_") + std::to_string(n));
      fs::remove_all(d);
      write_run(d, n, files);
      std::printf("N = %zu rows, %s (summary.csv %.1f MB)\n", n,
                  files ? "each scenario's six files too" : "summary.csv and summary.json only",
                  static_cast<double>(fs::file_size(d / "summary.csv")) / 1e6);
      if (time_report(d, n) && plots) {
        // The plot inputs report wrote (plots/index.csv, plots/storage.csv) are what plots.py reads.
        const std::string log = (base / ("plots_" + std::to_string(n) + (files ? "_files" : "") + ".log")).string();
        fs::remove(log);
        const auto t0 = std::chrono::steady_clock::now();
        const rh::ChildExit r = rh::run_process({python, script, d.string()}, log, timeout_s);
        const double dt = since(t0);
        if (r.timed_out) std::printf("  %-34s > %.0f s (timed out)\n", "plots.py", timeout_s);
        else if (r.exit_code != 0) std::printf("  %-34s exit %d (log: %s)\n", "plots.py", r.exit_code, log.c_str());
        else print_rate("plots.py", n, dt);
      }
      if (keep.empty()) fs::remove_all(d);
    }
  if (keep.empty()) fs::remove_all(base);
  return 0;
}
