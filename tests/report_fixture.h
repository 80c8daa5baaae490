// A small hand-written matrix run directory for the report tests: five scenarios in two groups
// (fp32 and per_key saves of the same bf16-moment config, an fp32 save of an fp32-moment config,
// a fault scenario that diverges, and a scenario that errored before writing anything), with
// byte counts chosen so the projection can be checked by hand: 100 parameters, fp32 states =
// 1400 payload bytes (14 B/param), bf16 moments = 1000 payload bytes (10 B/param).
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace report_fixture {

// The whole file as a string.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace fs = std::filesystem;

inline void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

// A fresh directory under the build tree (or /tmp), removed first.
inline fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("rh_report_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

inline std::string config(const std::string& moments) {
  return R"({"model":{"param_dtype":"bf16","d_model":64},"optimizer":{"exp_avg_dtype":")" + moments +
         R"(","exp_avg_sq_dtype":")" + moments + R"("},"train":{"iterations":6,"threads":1}})";
}

inline std::string disk(const std::string& master, const std::string& moments) {
  const std::string mb = moments == "F32" ? "400" : "200";
  const std::string mp = master == "F32" ? "400" : "200";
  return "file,key,kind,dtype,numel,bytes\n"
         "model.safetensors,w,model,BF16,100,200\n"
         "optim_rank_00000.safetensors,w/master_param,master_param," +
         master + ",100," + mp +
         "\n"
         "optim_rank_00000.safetensors,w/exp_avg,exp_avg," +
         moments + ",100," + mb +
         "\n"
         "optim_rank_00000.safetensors,w/exp_avg_sq,exp_avg_sq," +
         moments + ",100," + mb +
         "\n"
         "model.safetensors,<header>,metadata,,0,64\n"
         "optim_rank_00000.safetensors,<header>,metadata,,0,136\n"
         "manifest.json,<manifest>,metadata,,0,300\n";
}

// Metrics rows for iterations [from, to]; lm_loss = 4 - i/8 (exact in binary), + bump on
// iterations > 3 when bump != 0 (the diverging resumed run).
inline std::string metrics(int from, int to, double bump) {
  std::string s =
      "iteration,consumed_samples,lm_loss,lm_loss_hex,aux_loss,aux_loss_hex,total_loss,"
      "total_loss_hex,grad_norm,grad_norm_hex,lr,lr_hex,num_zeros\n";
  for (int i = from; i <= to; ++i) {
    const double l = 4.0 - i / 8.0 + (i > 3 ? bump : 0.0);
    char buf[512];
    std::snprintf(buf, sizeof buf, "%d,%d,%.9g,%a,0,0x0p+0,%.9g,%a,1.5,0x1.8p+0,0.01,%a,0\n", i, i * 16, l, l, l, l,
                  0.01);
    s += buf;
  }
  return s;
}

inline std::string metrics_compare(int from, int to, double bump) {
  std::string s = "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n";
  for (int i = from; i <= to; ++i) {
    const double b = 4.0 - i / 8.0, r = b + (i > 3 ? bump : 0.0), d = r - b;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%d,lm_loss,%.17g,%a,%.17g,%a,%.17g,%.17g,%d,%d\n", i, b, b, r, r, d, d / b,
                  d == 0 ? 0 : 1, d == 0 ? 1 : 0);
    s += buf;
  }
  return s;
}

inline std::string state_compare(int max_ulp_exp_avg) {
  return "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n"
         "after_load,model/w,model,BF16,BF16,100,1,0,0\n"
         "after_load,w/master_param,master_param,F32,F32,100,1,0,0\n"
         "after_load,w/exp_avg,exp_avg,F32,F32,100," +
         std::string(max_ulp_exp_avg ? "0.5,0.25," : "1,0,") + std::to_string(max_ulp_exp_avg) +
         "\nfinal,model/w,model,BF16,BF16,100,1,0,0\n";
}

inline std::string result_json(const std::string& name, const std::string& cfg) {
  return R"({"name":")" + name + R"(","save_at":3,"iterations":6,"config":)" + cfg + "}\n";
}

struct Scen {
  const char* name;
  const char* safe;
  const char* moments_cfg;   // in-memory moments of the config
  const char* policy;
  const char* disk_moments;   // dtype written
  double bump;                // resumed lm_loss offset after iteration 3
  int ulp_exp_avg;
};

inline const Scen kScenarios[] = {
    {"states/exp_avg=fp32,policy=fp32", "states__exp_avg=fp32+policy=fp32", "fp32", "fp32", "F32", 0, 0},
    {"states/exp_avg=bf16,policy=fp32", "states__exp_avg=bf16+policy=fp32", "bf16", "fp32", "F32", 0, 0},
    {"states/exp_avg=bf16,policy=per_key", "states__exp_avg=bf16+policy=per_key", "bf16", "per_key", "BF16", 0, 0},
    {"faults/skip=exp_avg", "faults__skip=exp_avg", "bf16", "native", "BF16", 0.0078125, 3},
};

// summary.csv exactly as the harness writes it (quoted fields where a comma appears).
inline std::string summary_csv() {
  return "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
         "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
         "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
         "master_mode,seconds\n"
         "\"states/exp_avg=fp32,policy=fp32\",exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,2400,24,100,"
         "fp32,none,fp32,fp32,fp32,1.25\n"
         "\"states/exp_avg=bf16,policy=fp32\",exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,2400,24,100,"
         "fp32,none,bf16,bf16,fp32,1.5\n"
         "\"states/exp_avg=bf16,policy=per_key\",exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,1800,18,"
         "100,per_key,none,bf16,bf16,fp32,1.75\n"
         "faults/skip=exp_avg,diverge,1,diverged,\"PASS: difference caught as expected: after load: w/exp_avg\","
         "after load: w/exp_avg,0.0078125,0,0,,3,0,,1800,18,100,native,skip_exp_avg,bf16,bf16,fp32,2\n"
         "faults/crash,exact,0,error,\"FAIL: error: baseline process exited with 134, core dumped\","
         "\"baseline process exited with 134, core dumped\",0,,,,,,,0,0,0,native,none,bf16,bf16,fp32,0.5\n";
}

inline std::string summary_json() {
  std::string sc;
  for (const auto& s : kScenarios)
    sc += std::string(sc.empty() ? "" : ",") + R"({"name":")" + s.name + R"(","dir":"scenarios/)" + s.safe +
          R"(","config":)" + config(s.moments_cfg) + "}";
  sc += R"(,{"name":"faults/crash","dir":"scenarios/faults__crash"})";
  return R"({"file":"scenarios/fixture.toml","filter":"","scenarios":[)" + sc +
         R"(],"failed":1,"total":5,"seconds":7.25,"environment":{"harness_version":"0.1.0","git_commit":"abc123def456",)"
         R"("torch_version":"1.13.1","blas":"OpenBLAS 0.3.21","cuda_compiled":false,"threads_per_process":1,)"
         R"("jobs":2,"device":"cpu"}})"
         "\n";
}

// Writes the whole run directory.
inline void write_run(const fs::path& root) {
  write(root / "summary.csv", summary_csv());
  write(root / "summary.json", summary_json());
  for (const auto& s : kScenarios) {
    const fs::path d = root / "scenarios" / s.safe;
    write(d / "result.json", result_json(s.name, config(s.moments_cfg)));
    write(d / "disk.csv", disk("F32", s.disk_moments));
    write(d / "state_compare.csv", state_compare(s.ulp_exp_avg));
    write(d / "metrics_compare.csv", metrics_compare(4, 6, s.bump));
    write(d / "baseline" / "metrics.csv", metrics(1, 6, 0));
    write(d / "resumed" / "metrics.csv", metrics(4, 6, s.bump));
  }
  // faults/crash errored before writing anything: no scenario directory at all.
}

// A models file for the hand-computed projection.
inline void write_models(const fs::path& p) {
  write(p, R"(
[[model]]
name = "Big"
params = 100e9

[[model]]
name = "DeepSeek-V2-Lite"
params = 15.7e9
  [[model.published]]
  states = "fp32"
  gb = 222
  [[model.published]]
  states = "bf16"
  gb = 164
)");
}

}   // namespace report_fixture
