// report.md fits where it is posted: GitHub refuses a pull-request comment or a step summary over
// 65,536 characters. On generated run directories of the default matrix's size and far beyond
// (every scenario failing, with long verdicts and diagnoses), report.md stays under the limit and
// keeps the verdict, the failures with their diagnoses and the key findings, and says what it
// left out; report.html keeps everything. And render_markdown's own rule on small documents:
// a section that fits is whole, one that does not loses its tables, then itself, and each is named.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "report_fixture.h"
#include "reports/document.h"
#include "reports/report.h"

namespace {

namespace fs = std::filesystem;
using namespace rh::report;
using report_fixture::slurp;

constexpr size_t kGitHubLimit = 65536;

struct RunShape {
  const char* label;
  int groups, per_group;
  bool all_fail;
  size_t verdict_chars;   // the length of each failing verdict's free text
};

// A run directory of groups x per_group scenarios in the harness's own summary.csv columns,
// each scenario with the files a finished built-in check writes.
void write_generated_run(const fs::path& root, const RunShape& shape) {
  std::string csv =
      "scenario,expectation,passed,outcome,verdict,first_divergence,max_abs_dloss,max_ulp_model,"
      "max_ulp_master_param,max_ulp_remainder,max_ulp_exp_avg,max_ulp_exp_avg_sq,max_ulp_scale,"
      "checkpoint_bytes,bytes_per_param,num_params,save_policy,fault,exp_avg_dtype,exp_avg_sq_dtype,"
      "master_mode,seconds,compress,raw_bytes_per_param,external,diagnosis,explanation\n";
  std::string entries;
  int index = 0;
  for (int g = 0; g < shape.groups; ++g)
    for (int k = 0; k < shape.per_group; ++k, ++index) {
      const std::string name = "group" + std::to_string(g) + "/moments=bf16,master=remainders,policy=per_key,seed=" +
                               std::to_string(k);
      std::string safe = name;
      for (size_t at; (at = safe.find('/')) != std::string::npos;) safe.replace(at, 1, "__");
      for (auto& c : safe) c = c == ',' ? '+' : c;
      const bool fail = shape.all_fail || index % 17 == 3;
      const std::string why(shape.verdict_chars, 'w');
      const std::string verdict = fail ? "FAIL: expected bit-exact resume; first divergence: after load: "
                                         "layers.0.mlp.experts.3.weight/exp_avg " + why
                                       : "PASS: bit-exact resume";
      const std::string first = fail ? "after load: layers.0.mlp.experts.3.weight/exp_avg" : "";
      const bool moments_f32 = k % 2 == 0;
      csv += "\"" + name + "\",exact," + (fail ? "0,diverged," : "1,identical,") + "\"" + verdict + "\"," + first +
             "," + (fail ? "0.0078125" : "0") + ",0,0,," + (fail ? "3" : "0") + ",0,," +
             (moments_f32 ? "2400,24" : "1800,18") + ",100," + (moments_f32 ? "fp32" : "per_key") +
             ",none,bf16,bf16,fp32,1.5,none,0,0," + (fail ? "after-load,\"the state right after the load differs " + why + "\"" : ",") +
             "\n";
      entries += std::string(entries.empty() ? "" : ",") + R"({"name":")" + name + R"(","dir":"scenarios/)" + safe +
                 R"(","config":)" + report_fixture::config("bf16") + "}";
      const fs::path d = root / "scenarios" / safe;
      report_fixture::write(d / "result.json", report_fixture::result_json(name, report_fixture::config("bf16")));
      report_fixture::write(d / "disk.csv", report_fixture::disk("F32", moments_f32 ? "F32" : "BF16"));
      report_fixture::write(d / "state_compare.csv", report_fixture::state_compare(fail ? 3 : 0));
      report_fixture::write(d / "metrics_compare.csv", report_fixture::metrics_compare(4, 6, fail ? 0.0078125 : 0));
      report_fixture::write(d / "baseline" / "metrics.csv", report_fixture::metrics(1, 6, 0));
      report_fixture::write(d / "resumed" / "metrics.csv", report_fixture::metrics(4, 6, fail ? 0.0078125 : 0));
    }
  report_fixture::write(root / "summary.csv", csv);
  report_fixture::write(root / "summary.json",
                        R"({"file":"scenarios/generated.toml","filter":"","scenarios":[)" + entries +
                            R"(],"seconds":7.25,"environment":{"harness_version":"0.1.0","git_commit":"abc",)"
                            R"("torch_version":"1.13.1","blas":"OpenBLAS","cuda_compiled":false,)"
                            R"("threads_per_process":1,"jobs":2,"device":"cpu"}})"
                            "\n");
}

class ReportSize : public ::testing::TestWithParam<RunShape> {
 protected:
  void SetUp() override { setenv("RH_PYTHON", "/bin/false", 1); }   // tables only: plots cost time
  void TearDown() override { unsetenv("RH_PYTHON"); }
};

TEST_P(ReportSize, MarkdownFitsGitHubAndKeepsTheVerdictAndFailures) {
  const RunShape& shape = GetParam();
  const fs::path dir = report_fixture::temp_dir(std::string("size_") + shape.label);
  write_generated_run(dir, shape);
  std::ostringstream log;
  generate_report(dir.string(), "", log);
  const std::string md = slurp(dir / "report.md"), html = slurp(dir / "report.html");
  const size_t scenarios = static_cast<size_t>(shape.groups * shape.per_group);
  EXPECT_LE(md.size(), kMarkdownLimit) << shape.label;
  EXPECT_LT(md.size(), kGitHubLimit) << shape.label;
  // The verdict and the first failure with its diagnosis are always there.
  EXPECT_NE(md.find("**FAILED"), std::string::npos) << md.substr(0, 400);
  EXPECT_NE(md.find("group0/moments=bf16,master=remainders,policy=per_key,seed=" + std::to_string(shape.all_fail ? 0 : 3) +
                    " (expected exact, found diverged)"),
            std::string::npos);
  EXPECT_NE(md.find("diagnosis after-load: the state right after the load differs"), std::string::npos);
  // report.html holds every scenario; the Markdown says what it left out, where.
  size_t rows = 0;
  for (size_t at = 0; (at = html.find("<tr class=\"pass\"><td", at)) != std::string::npos; ++at) ++rows;
  for (size_t at = 0; (at = html.find("<tr class=\"fail\"><td", at)) != std::string::npos; ++at) ++rows;
  EXPECT_EQ(rows, scenarios);
  const std::string last_row = "| group" + std::to_string(shape.groups - 1) +
                               "/moments=bf16,master=remainders,policy=per_key,seed=" +
                               std::to_string(shape.per_group - 1) + " |";
  const bool matrix_whole = md.find(last_row) != std::string::npos;
  if (!matrix_whole) {
    EXPECT_NE(md.find("Left out of this Markdown to stay under the 65,536 characters"), std::string::npos) << shape.label;
    EXPECT_NE(md.find("report.html in the run directory holds every section"), std::string::npos);
  }
  if (shape.all_fail) {   // the failure list itself is cut, with the count of the rest
    EXPECT_NE(md.find(" more, left out here for length (report.html and summary.csv list every one)"),
              std::string::npos);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, ReportSize,
    ::testing::Values(RunShape{"default_size", 20, 10, false, 40},    // 200 cells, about scenarios/default.toml (198)
                      RunShape{"thousand", 40, 25, false, 40},       // 1,000 cells
                      RunShape{"all_failing", 20, 25, true, 600}),    // 500 failures with long texts
    [](const auto& info) { return std::string(info.param.label); });

Table rows_table(size_t rows, size_t width) {
  Table t;
  t.header = {"name", "value"};
  t.right = {false, true};
  for (size_t i = 0; i < rows; ++i) t.rows.push_back({"row" + std::to_string(i), std::string(width, 'v')});
  return t;
}

// The rule itself: sections in order, each whole when it fits, else without its tables, else out.
TEST(MarkdownLimit, SectionsKeepTheirTextThenLoseTablesThenLeaveNamed) {
  Document doc;
  doc.title = "t";
  doc.status = "PASSED";
  doc.paragraph("head text");
  doc.fold_from = doc.blocks.size();
  doc.heading("Small");
  doc.table(rows_table(3, 10));
  doc.heading("Wide table");
  doc.paragraph("wide's own text");
  doc.table(rows_table(100, 100));
  doc.heading("Huge text");
  doc.paragraph(std::string(9000, 'h'));
  doc.markdown_limit = 8000;
  const std::string md = render_markdown(doc);
  EXPECT_LE(md.size(), 8000u);
  EXPECT_NE(md.find("head text"), std::string::npos);
  EXPECT_NE(md.find("<details><summary>Small</summary>"), std::string::npos);
  EXPECT_NE(md.find("| row2 |"), std::string::npos);                    // a table that fits stays
  EXPECT_NE(md.find("wide's own text"), std::string::npos);             // the text of a cut section stays
  EXPECT_EQ(md.find("| row50 |"), std::string::npos);                   // its table does not
  EXPECT_NE(md.find("*A table of 100 rows, left out here for length: see report.html.*"), std::string::npos);
  EXPECT_EQ(md.find("hhhh"), std::string::npos);                        // a section too long even without tables
  EXPECT_NE(md.find("the tables of \"Wide table\" (100 rows) and the section \"Huge text\""), std::string::npos) << md;
  // The note comes right after the unfolded part, before the folds.
  EXPECT_LT(md.find("Left out of this Markdown"), md.find("<details>"));
  // Under the default limit nothing is left out and nothing is said about it.
  doc.markdown_limit = kMarkdownLimit;
  const std::string whole = render_markdown(doc);
  EXPECT_NE(whole.find("| row99 |"), std::string::npos);
  EXPECT_NE(whole.find(std::string(9000, 'h')), std::string::npos);
  EXPECT_EQ(whole.find("Left out"), std::string::npos);
}

}   // namespace
