// Result and summary files; see writers.h.
#include "harness/verify/writers.h"

#include <filesystem>

#include "harness/base/text.h"
#include "harness/base/input.h"
#include "harness/train/env.h"
#include "harness/train/metrics.h"
#include "harness/verify/check.h"

namespace fs = std::filesystem;

namespace rh {

namespace {

// The built-in trainer's settings mean nothing for an external cell: null there.
nlohmann::json builtin_only(const Scenario& scenario, nlohmann::json value) {
  return scenario.trainer ? nlohmann::json(nullptr) : value;
}

nlohmann::json key_table(const std::vector<std::pair<std::string, std::string>>& rows, const char* field) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, value] : rows) out.push_back({{"key", key}, {field, value}});
  return out;
}

}   // namespace

nlohmann::json result_json(const Scenario& scenario, const CheckResult& result) {
  return {{"name", result.name},
          {"description", scenario.description},
          {"expectation", result.expectation},
          {"reason", scenario.expect.reason},
          {"passed", result.passed},
          {"verdict", result.verdict},
          {"outcome", to_string(result.outcome)},
          {"first_divergence", result.first_divergence},
          {"load_error", result.load_error},
          {"max_abs_dloss", result.max_abs_dloss},
          {"max_ulp_after_load", result.max_ulp_after_load},
          {"bit_equal_after_load", result.bit_equal_after_load},
          {"control_fresh_differs", result.control_fresh_differs},
          {"control_k_differs", result.control_k_differs},
          {"checkpoint_bytes", result.checkpoint_bytes},
          {"bytes_per_param", result.bytes_per_param},
          {"raw_bytes_per_param", result.raw_bytes_per_param},
          {"num_params", result.num_params},
          {"seconds", result.seconds},
          {"save_at", scenario.save_at},
          {"dp_size", builtin_only(scenario, scenario.dp_size)},
          {"resume_dp_size", builtin_only(scenario, scenario.resume_dp())},
          {"after_load_differs", result.after_load_differs},
          {"iterations", scenario.cfg.train.iterations},
          {"save_policy", builtin_only(scenario, ckpt::to_string(scenario.policy.kind))},
          {"compress", builtin_only(scenario, ckpt::to_string(scenario.policy.compress))},
          {"fault", builtin_only(scenario, to_string(scenario.fault))},
          {"config", builtin_only(scenario, to_json(scenario.cfg))},
          {"external", scenario.trainer.has_value()},
          {"diagnosis", result.diagnosis},
          {"explanation", result.explanation},
          {"notes", result.notes},
          {"harness_varied", key_table(result.harness_varied, "as")},
          {"ignored", key_table(result.ignored, "reason")},
          {"trainer_seconds", result.trainer_seconds}};
}

void write_cell_outputs(const std::string& dir_str, const Scenario& scenario, const CheckResult& result) {
  // Opened from the run directory now, without following a link (an external trainer that ran in
  // the cell may have replaced it with one): a link is a SymlinkRefused naming it.
  const BeneathDir dir = open_work_dir(dir_str);
  std::string metrics_csv =
      "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n";
  for (const auto& diff : result.metric_diffs)
    metrics_csv += std::to_string(diff.iteration) + "," + diff.metric + "," + exact_decimal(diff.baseline) + "," +
                   hex_float(diff.baseline) + "," + exact_decimal(diff.resumed) + "," + hex_float(diff.resumed) + "," +
                   exact_decimal(diff.abs_diff) + "," + exact_decimal(diff.rel_diff) + "," + std::to_string(diff.ulp) +
                   "," + (diff.bit_equal ? "1" : "0") + "\n";
  dir.write_file("metrics_compare.csv", metrics_csv);
  std::string state_csv = "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n";
  auto rows = [&](const char* phase, const std::vector<TensorDiff>& diffs) {
    for (const auto& diff : diffs)
      state_csv += std::string(phase) + "," + csv_field(diff.key) + "," + diff.kind + "," + diff.dtype_a + "," + diff.dtype_b +
                   "," + std::to_string(diff.numel) + "," + exact_decimal(diff.bit_equal_fraction) + "," +
                   exact_decimal(diff.max_abs_diff) + "," + std::to_string(diff.max_ulp) + "\n";
  };
  rows("after_load", result.after_load);
  rows("final", result.final_state);
  for (const auto& [phase, diffs] : result.other_state) rows(phase.c_str(), diffs);
  dir.write_file("state_compare.csv", state_csv);
  dir.write_file("result.json", dump_text(result_json(scenario, result), 2) + "\n");
}

namespace {

// junit's failure message: the verdict, then an external cell's diagnosis when the verdict lacks it.
std::string failure_message(const CheckResult& result) {
  const bool diagnosed = !result.diagnosis.empty() && result.diagnosis != "none";
  if (!diagnosed || result.verdict.find(result.explanation) != std::string::npos) return result.verdict;
  return result.verdict + " | diagnosis " + result.diagnosis + ": " + result.explanation;
}

}   // namespace

void write_junit(const std::string& path, const std::string& suite, const std::vector<CheckResult>& results) {
  size_t failures = 0;
  double total = 0;
  for (const auto& result : results) {
    failures += result.passed ? 0 : 1;
    total += result.seconds;
  }
  const std::string esc_suite = markup_escape(suite);
  std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  xml +=
      "<testsuites tests=\"" + std::to_string(results.size()) + "\" failures=\"" + std::to_string(failures) + "\">\n";
  xml += "  <testsuite name=\"" + esc_suite + "\" tests=\"" + std::to_string(results.size()) + "\" failures=\"" +
         std::to_string(failures) + "\" errors=\"0\" time=\"" + exact_decimal(total) + "\">\n";
  for (const auto& result : results) {
    xml += "    <testcase classname=\"" + esc_suite + "\" name=\"" + markup_escape(result.name) + "\" time=\"" +
           exact_decimal(result.seconds) + "\"";
    if (result.passed) {
      xml += "/>\n";
    } else {
      const std::string message = failure_message(result);
      xml += ">\n      <failure message=\"" + markup_escape(message) + "\">" + markup_escape(message) +
             "</failure>\n    </testcase>\n";
    }
  }
  xml += "  </testsuite>\n</testsuites>\n";
  write_text(path, xml);
}

namespace {

std::string summary_row(const Scenario& scenario, const CheckResult& result) {
  auto ulp = [&](const char* kind) {
    auto it = result.max_ulp_after_load.find(kind);
    return it == result.max_ulp_after_load.end() ? std::string("") : std::to_string(it->second);
  };
  const auto mode =
      optim::effective_master_mode(scenario.cfg.optim,
                                   scenario.cfg.model.param_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  const bool external = scenario.trainer.has_value();   // no built-in settings: empty there
  auto builtin = [&](const std::string& text) { return external ? std::string() : text; };
  return csv_field(result.name) + "," + result.expectation + "," + (result.passed ? "1" : "0") + "," +
         to_string(result.outcome) + "," + csv_field(result.verdict) + "," + csv_field(result.first_divergence) + "," +
         exact_decimal(result.max_abs_dloss) + "," + ulp("model") + "," + ulp("master_param") + "," + ulp("remainder") +
         "," + ulp("exp_avg") + "," + ulp("exp_avg_sq") + "," + ulp("scale") + "," +
         std::to_string(result.checkpoint_bytes) + "," + exact_decimal(result.bytes_per_param) + "," +
         std::to_string(result.num_params) + "," + builtin(ckpt::to_string(scenario.policy.kind)) + "," +
         builtin(to_string(scenario.fault)) + "," + builtin(optim::to_string(scenario.cfg.optim.exp_avg_dtype)) + "," +
         builtin(optim::to_string(scenario.cfg.optim.exp_avg_sq_dtype)) + "," + builtin(optim::to_string(mode)) + "," +
         exact_decimal(result.seconds) + "," + ckpt::to_string(scenario.policy.compress) + "," +
         exact_decimal(result.raw_bytes_per_param) + "," + (external ? "1" : "0") + "," + csv_field(result.diagnosis) +
         "," + csv_field(result.explanation) + "\n";
}

}   // namespace

void write_summary(const RunSummary& run, const std::vector<Scenario>& scenarios,
                   const std::vector<CheckResult>& results) {
  const fs::path dir(run.run_dir);
  std::string csv =
      "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
      "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
      "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
      "master_mode,seconds,compress,raw_bytes_per_param,external,diagnosis,explanation\n";
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
