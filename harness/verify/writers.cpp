// Result and summary files; see writers.h.
#include "harness/verify/writers.h"

#include <filesystem>

#include "harness/base/text.h"
#include "harness/base/input.h"
#include "harness/train/env.h"
#include "harness/train/metrics.h"

namespace fs = std::filesystem;

namespace rh {

nlohmann::json result_json(const Scenario& s, const CheckResult& r) {
  return {{"name", r.name},
          {"description", s.description},
          {"expectation", r.expectation},
          {"reason", s.expect.reason},
          {"passed", r.passed},
          {"verdict", r.verdict},
          {"outcome", to_string(r.outcome)},
          {"first_divergence", r.first_divergence},
          {"load_error", r.load_error},
          {"max_abs_dloss", r.max_abs_dloss},
          {"max_ulp_after_load", r.max_ulp_after_load},
          {"bit_equal_after_load", r.bit_equal_after_load},
          {"control_fresh_differs", r.control_fresh_differs},
          {"control_k_differs", r.control_k_differs},
          {"checkpoint_bytes", r.checkpoint_bytes},
          {"bytes_per_param", r.bytes_per_param},
          {"raw_bytes_per_param", r.raw_bytes_per_param},
          {"num_params", r.num_params},
          {"seconds", r.seconds},
          {"save_at", s.save_at},
          {"dp_size", s.dp_size},
          {"resume_dp_size", s.resume_dp()},
          {"after_load_differs", r.after_load_differs},
          {"iterations", s.cfg.train.iterations},
          {"save_policy", ckpt::to_string(s.policy.kind)},
          {"compress", ckpt::to_string(s.policy.compress)},
          {"fault", to_string(s.fault)},
          {"config", to_json(s.cfg)},
          {"external", s.trainer.has_value()},
          {"diagnosis", r.diagnosis},
          {"explanation", r.explanation},
          {"notes", r.notes},
          {"trainer_seconds", r.trainer_seconds}};
}

void write_cell_outputs(const std::string& dir_str, const Scenario& s, const CheckResult& r) {
  const fs::path dir(dir_str);
  std::string mc = "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n";
  for (const auto& m : r.metric_diffs)
    mc += std::to_string(m.iteration) + "," + m.metric + "," + exact_decimal(m.baseline) + "," + hex_float(m.baseline) +
          "," + exact_decimal(m.resumed) + "," + hex_float(m.resumed) + "," + exact_decimal(m.abs_diff) + "," +
          exact_decimal(m.rel_diff) + "," + std::to_string(m.ulp) + "," + (m.bit_equal ? "1" : "0") + "\n";
  write_text((dir / "metrics_compare.csv").string(), mc);
  std::string sc = "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n";
  auto rows = [&](const char* phase, const std::vector<TensorDiff>& v) {
    for (const auto& d : v)
      sc += std::string(phase) + "," + d.key + "," + d.kind + "," + d.dtype_a + "," + d.dtype_b + "," +
            std::to_string(d.numel) + "," + exact_decimal(d.bit_equal_fraction) + "," + exact_decimal(d.max_abs_diff) +
            "," + std::to_string(d.max_ulp) + "\n";
  };
  rows("after_load", r.after_load);
  rows("final", r.final_state);
  write_text((dir / "state_compare.csv").string(), sc);
  write_text((dir / "result.json").string(), dump_text(result_json(s, r), 2) + "\n");
}

void write_junit(const std::string& path, const std::string& suite, const std::vector<CheckResult>& results) {
  size_t failures = 0;
  double total = 0;
  for (const auto& r : results) {
    failures += r.passed ? 0 : 1;
    total += r.seconds;
  }
  const std::string esc_suite = markup_escape(suite);
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += "<testsuites tests=\"" + std::to_string(results.size()) + "\" failures=\"" + std::to_string(failures) + "\">\n";
  x += "  <testsuite name=\"" + esc_suite + "\" tests=\"" + std::to_string(results.size()) + "\" failures=\"" +
       std::to_string(failures) + "\" errors=\"0\" time=\"" + exact_decimal(total) + "\">\n";
  for (const auto& r : results) {
    x += "    <testcase classname=\"" + esc_suite + "\" name=\"" + markup_escape(r.name) + "\" time=\"" +
         exact_decimal(r.seconds) + "\"";
    if (r.passed) {
      x += "/>\n";
    } else {
      x += ">\n      <failure message=\"" + markup_escape(r.verdict) + "\">" + markup_escape(r.verdict) +
           "</failure>\n    </testcase>\n";
    }
  }
  x += "  </testsuite>\n</testsuites>\n";
  write_text(path, x);
}

namespace {

std::string summary_row(const Scenario& s, const CheckResult& r) {
  auto ulp = [&](const char* k) {
    auto it = r.max_ulp_after_load.find(k);
    return it == r.max_ulp_after_load.end() ? std::string("") : std::to_string(it->second);
  };
  const auto mode =
      optim::effective_master_mode(s.cfg.optim, s.cfg.model.param_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  return csv_field(r.name) + "," + r.expectation + "," + (r.passed ? "1" : "0") + "," + to_string(r.outcome) + "," +
         csv_field(r.verdict) + "," + csv_field(r.first_divergence) + "," + exact_decimal(r.max_abs_dloss) + "," +
         ulp("model") + "," + ulp("master_param") + "," + ulp("remainder") + "," + ulp("exp_avg") + "," +
         ulp("exp_avg_sq") + "," + ulp("scale") + "," + std::to_string(r.checkpoint_bytes) + "," +
         exact_decimal(r.bytes_per_param) + "," + std::to_string(r.num_params) + "," + ckpt::to_string(s.policy.kind) +
         "," + to_string(s.fault) + "," + optim::to_string(s.cfg.optim.exp_avg_dtype) + "," +
         optim::to_string(s.cfg.optim.exp_avg_sq_dtype) + "," + optim::to_string(mode) + "," +
         exact_decimal(r.seconds) + "," + ckpt::to_string(s.policy.compress) + "," +
         exact_decimal(r.raw_bytes_per_param) + "\n";
}

}   // namespace

void write_summary(const RunSummary& run, const std::vector<Scenario>& scenarios,
                   const std::vector<CheckResult>& results) {
  const fs::path dir(run.run_dir);
  std::string csv =
      "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
      "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
      "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
      "master_mode,seconds,compress,raw_bytes_per_param\n";
  nlohmann::json list = nlohmann::json::array();
  size_t failed = 0;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    failed += results[i].passed ? 0 : 1;
    csv += summary_row(scenarios[i], results[i]);
    auto one = result_json(scenarios[i], results[i]);
    one["dir"] = (fs::path("scenarios") / safe_name(results[i].name)).string();
    list.push_back(one);
  }
  write_text((dir / "summary.csv").string(), csv);
  const auto info = runtime_info();
  const RunConfig first = scenarios.empty() ? RunConfig{} : scenarios.front().cfg;
  nlohmann::json summary = {{"file", run.file},
                            {"file_xxh3", run.file_xxh3},
                            {"filter", run.filter},
                            {"scenarios", list},
                            {"failed", failed},
                            {"total", scenarios.size()},
                            {"seconds", run.seconds},
                            {"environment",
                             {{"harness_version", info.harness_version},
                              {"git_commit", info.git_commit},
                              {"torch_version", info.torch_version},
                              {"blas", info.blas},
                              {"cuda_compiled", info.cuda_compiled},
                              {"threads_per_process", first.train.threads},
                              {"jobs", run.jobs},
                              {"device", first.train.device}}}};
  if (run.shard_count > 0)
    summary["shard"] = {{"index", run.shard_index}, {"count", run.shard_count}, {"cells", run.matrix_cells}};
  write_text((dir / "summary.json").string(), dump_text(summary, 2) + "\n");
}

}   // namespace rh
