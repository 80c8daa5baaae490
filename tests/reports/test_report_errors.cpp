// The report's failure paths and compare mode: a malformed CSV is an error naming file and line
// (exit 2); a missing interpreter or matplotlib still writes the tables; an errored scenario's
// missing files are noted, not fatal; `--compare` on two runs that differ in one verdict, as
// Markdown and as JSON (`--compare --json`); the tool's exit codes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "report_fixture.h"
#include "reports/compare_runs.h"
#include "reports/report.h"
#include "reports/report_writer.h"
#include "reports/run_data.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace rh::report;

using report_fixture::slurp;

// Replaces line `line` (1-based) of a file.
void replace_line(const fs::path& file_path, int line, const std::string& text) {
  std::istringstream in(slurp(file_path));
  std::string out, original_line;
  for (int i = 1; std::getline(in, original_line); ++i) out += (i == line ? text : original_line) + "\n";
  report_fixture::write(file_path, out);
}

// Runs without plots: the tests here are about tables and errors, and /bin/false is quick.
class NoPlots : public ::testing::Test {
 protected:
  void SetUp() override { setenv("RH_PYTHON", "/bin/false", 1); }
  void TearDown() override { unsetenv("RH_PYTHON"); }
};

struct Malformed {
  const char* name;
  const char* file;   // relative to the run dir
  int line;
  const char* text;
  const char* expect;   // part of the message
};

class MalformedCsv : public NoPlots, public ::testing::WithParamInterface<Malformed> {};

TEST_P(MalformedCsv, ErrorNamesFileAndLine) {
  const auto& malformed = GetParam();
  const auto dir = report_fixture::temp_dir(std::string("bad_") + malformed.name);
  report_fixture::write_run(dir);
  replace_line(dir / malformed.file, malformed.line, malformed.text);
  const std::string where = (dir / malformed.file).string() + ":" + std::to_string(malformed.line) + ":";
  try {
    std::ostringstream log;
    generate_report(dir.string(), "", log);
    FAIL() << "no error for " << malformed.file;
  } catch (const ReportError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(where, 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(malformed.expect), std::string::npos) << e.what();
  }
  std::ostringstream out;
  testing::internal::CaptureStderr();
  EXPECT_EQ(rh::write_report(dir.string(), out), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find(where), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "report.md"));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Files, MalformedCsv,
    ::testing::Values(
        Malformed{"summary_number", "summary.csv", 3,
                  "\"states/exp_avg=bf16,policy=fp32\",exact,1,identical,PASS,,zero,0,0,,0,0,,2400,24,100,fp32,none,"
                  "bf16,bf16,fp32,1.5",
                  "column max_abs_dloss: expected a number, got 'zero'"},
        Malformed{"summary_columns", "summary.csv", 4, "states/x,exact,1", "malformed CSV"},
        Malformed{"summary_header", "summary.csv", 1, "scenario,expectation", "Missing column"},
        Malformed{"disk_bytes", "scenarios/states__exp_avg=bf16+policy=per_key/disk.csv", 3,
                  "optim_rank_00000.safetensors,w/master_param,master_param,F32,100,4x0", "column bytes"},
        Malformed{"disk_kind", "scenarios/states__exp_avg=bf16+policy=per_key/disk.csv", 2,
                  "model.safetensors,w,weights,BF16,100,200", "column kind"},
        Malformed{"state_phase", "scenarios/faults__skip=exp_avg/state_compare.csv", 2,
                  "loaded,model/w,model,BF16,BF16,100,1,0,0", "column phase"},
        Malformed{"metrics_compare", "scenarios/faults__skip=exp_avg/metrics_compare.csv", 3, "5,lm_loss,3.375",
                  "malformed CSV"},
        Malformed{"baseline_metrics", "scenarios/states__exp_avg=fp32+policy=fp32/baseline/metrics.csv", 4,
                  "3,48,3.625,0xnothex,0,0x0p+0,3.625,0x1.dp+1,1.5,0x1.8p+0,0.01,0x1.47ae147ae147bp-7,0",
                  "lm_loss_hex"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(NoPlots, MissingRunDirOrSummaryIsAnError) {
  const auto dir = report_fixture::temp_dir("empty");
  std::ostringstream log;
  EXPECT_THROW(generate_report(dir.string(), "", log), ReportError);
  EXPECT_THROW(generate_report((dir / "nope").string(), "", log), ReportError);
  fs::remove_all(dir);
}

TEST_F(NoPlots, MalformedModelsFileNamesLine) {
  const auto dir = report_fixture::temp_dir("models");
  report_fixture::write_run(dir);
  report_fixture::write(dir / "m.toml", "[[model]]\nname = \"x\"\nparams = \"many\"\n");
  std::ostringstream log;
  try {
    generate_report(dir.string(), (dir / "m.toml").string(), log);
    FAIL();
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("m.toml:3: key 'params': expected a number"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// reports/ reads the run directory as hostile input: a FIFO in place of a file the harness wrote
// is refused naming it (it used to block the report forever), as is a file over the size cap.
TEST_F(NoPlots, FifoInPlaceOfARunFileIsRefusedNotWaitedOn) {
  for (const char* name : {"summary.csv", "scenarios/states__exp_avg=fp32+policy=fp32/disk.csv"}) {
    const auto dir = report_fixture::temp_dir("fifo");
    report_fixture::write_run(dir);
    fs::remove(dir / name);
    ASSERT_EQ(mkfifo((dir / name).c_str(), 0600), 0);
    std::ostringstream log;
    try {
      generate_report(dir.string(), "", log);
      FAIL() << name;
    } catch (const ReportError& e) {
      EXPECT_NE(std::string(e.what()).find((dir / name).string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("is a FIFO, expected a regular file"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
  }
}

TEST(RunFiles, AFileOverTheCapIsRefusedBeforeItIsRead) {
  const auto dir = report_fixture::temp_dir("cap");
  report_fixture::write(dir / "big.csv", std::string(4096, 'x'));
  EXPECT_EQ(read_run_file((dir / "big.csv").string(), 4096).size(), 4096u);
  try {
    read_run_file((dir / "big.csv").string(), 4095);
    FAIL();
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("big.csv"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST_F(NoPlots, NonAsciiModelsFileIsRefusedNamingLineAndColumn) {
  const auto dir = report_fixture::temp_dir("models_utf8");
  report_fixture::write_run(dir);
  report_fixture::write(dir / "m.toml", "[[model]]\nname = \"x\"\xd0\x83\nparams = 1\n");
  std::ostringstream log;
  try {
    generate_report(dir.string(), (dir / "m.toml").string(), log);
    FAIL();
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("m.toml:2: column 11: byte 0xD0 is not ASCII"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

class NoMatplotlib : public ::testing::TestWithParam<const char*> {};

TEST_P(NoMatplotlib, TablesAreStillWritten) {
  const auto dir = report_fixture::temp_dir("nompl");
  report_fixture::write_run(dir);
  setenv("RH_PYTHON", GetParam(), 1);
  std::ostringstream log;
  const auto files = generate_report(dir.string(), "", log);
  unsetenv("RH_PYTHON");
  EXPECT_FALSE(files.plots.ok);
  EXPECT_NE(files.plots.message.find(GetParam()), std::string::npos) << files.plots.message;
  EXPECT_NE(log.str().find("plots not drawn"), std::string::npos);
  const std::string md = slurp(dir / "report.md"), html = slurp(dir / "report.html");
  EXPECT_NE(md.find("Plots not drawn: "), std::string::npos);
  EXPECT_NE(md.find("| states/exp_avg=bf16,policy=per_key |"), std::string::npos);
  EXPECT_NE(md.find("| DeepSeek-V2-Lite |"), std::string::npos);
  EXPECT_EQ(md.find(".png)"), std::string::npos);
  EXPECT_EQ(html.find("data:image/png"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "plots" / kLossPlot));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Interpreters, NoMatplotlib, ::testing::Values("/bin/false", "/nonexistent/python3"),
                         [](const auto& info) {
                           return info.index == 0 ? std::string("bin_false") : std::string("nonexistent");
                         });

TEST_F(NoPlots, ErroredScenarioIsNotedNotFatal) {
  const auto dir = report_fixture::temp_dir("errored");
  report_fixture::write_run(dir);
  // A scenario that got as far as result.json only.
  fs::remove(dir / "scenarios/faults__skip=exp_avg/disk.csv");
  fs::remove_all(dir / "scenarios/faults__skip=exp_avg/resumed");
  std::ostringstream log;
  generate_report(dir.string(), "", log);
  const std::string md = slurp(dir / "report.md");
  EXPECT_NE(md.find("- faults/crash: the check errored: baseline process exited with 134, core dumped. missing in "
                    "scenarios/faults__crash: result.json disk.csv state_compare.csv metrics_compare.csv "
                    "baseline/metrics.csv resumed/metrics.csv"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- faults/skip=exp_avg: missing in scenarios/faults__skip=exp_avg: disk.csv resumed/metrics.csv"),
            std::string::npos);
  // Without its disk.csv the native storage is not measured: only fp32 and per_key rows remain.
  EXPECT_EQ(md.find("| native: "), std::string::npos);
  EXPECT_NE(md.find("| per_key: "), std::string::npos);
  fs::remove_all(dir);
}

// A load refused as declared trains no resumed run: no note says its resumed/metrics.csv is missing
// (the default matrix had 30 such notes); any other missing file of it is still noted.
TEST_F(NoPlots, ARefusedLoadsMissingResumedMetricsIsNotNoted) {
  const auto dir = report_fixture::temp_dir("refused_notes");
  report_fixture::write_run(dir);
  replace_line(dir / "summary.csv", 5,
               "faults/skip=exp_avg,refused,1,load-refused,\"PASS: load refused as expected\",,0,0,0,,3,0,,1800,18,100,"
               "native,skip_exp_avg,bf16,bf16,fp32,2");
  fs::remove_all(dir / "scenarios/faults__skip=exp_avg/resumed");
  std::ostringstream log;
  generate_report(dir.string(), "", log);
  std::string md = slurp(dir / "report.md");
  EXPECT_EQ(md.find("- faults/skip=exp_avg: missing"), std::string::npos) << md;
  fs::remove(dir / "scenarios/faults__skip=exp_avg/disk.csv");
  generate_report(dir.string(), "", log);
  md = slurp(dir / "report.md");
  EXPECT_NE(md.find("- faults/skip=exp_avg: missing in scenarios/faults__skip=exp_avg: disk.csv (the tables"),
            std::string::npos)
      << md;
  fs::remove_all(dir);
}

// Two runs that differ in one verdict (and that scenario's first divergence and bytes).
struct TwoRuns {
  fs::path a, b;
  TwoRuns() {
    a = report_fixture::temp_dir("cmp_a");
    b = report_fixture::temp_dir("cmp_b");
    report_fixture::write_run(a);
    report_fixture::write_run(b);
    replace_line(b / "summary.csv", 4,
                 "\"states/exp_avg=bf16,policy=per_key\",exact,0,diverged,\"FAIL: expected bit-exact resume; first "
                 "divergence: iteration 5: metric lm_loss\",iteration 5: metric lm_loss,0.25,0,0,,0,0,,1900,19,100,"
                 "per_key,none,bf16,bf16,fp32,1.75");
  }
  ~TwoRuns() {
    fs::remove_all(a);
    fs::remove_all(b);
  }
};

TEST(ReportCompare, OneVerdictRegressed) {
  TwoRuns two_runs;
  std::ostringstream out;
  EXPECT_EQ(compare_runs(two_runs.a.string(), two_runs.b.string(), out), 1);
  const std::string md = out.str();
  EXPECT_NE(md.find("- 1 regression(s) (passed in A, fail in B), 0 fixed"), std::string::npos) << md;
  EXPECT_NE(md.find("| states/exp_avg=bf16,policy=per_key | PASS (identical) | FAIL (diverged) | regression |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| states/exp_avg=bf16,policy=per_key | none | iteration 5: metric lm_loss |"), std::string::npos);
  EXPECT_NE(md.find("| states/exp_avg=bf16,policy=per_key | 1800 | 1900 | +5.56 % |"), std::string::npos);
  // Nothing else changed.
  EXPECT_EQ(md.find("states/exp_avg=fp32,policy=fp32"), std::string::npos);
  EXPECT_EQ(md.find("faults/"), std::string::npos);
}

TEST(ReportCompare, FixedIsNotARegressionAndSameRunHasNoChanges) {
  TwoRuns two_runs;
  std::ostringstream back, same;
  EXPECT_EQ(compare_runs(two_runs.b.string(), two_runs.a.string(), back), 0);
  EXPECT_NE(back.str().find("| FAIL (diverged) | PASS (identical) | fixed |"), std::string::npos) << back.str();
  EXPECT_EQ(compare_runs(two_runs.a.string(), two_runs.a.string(), same), 0);
  EXPECT_NE(same.str().find("No differences in verdicts, first divergences or checkpoint bytes."), std::string::npos);
}

TEST(ReportCompare, AddedAndRemovedScenariosAreListed) {
  TwoRuns two_runs;
  replace_line(two_runs.b / "summary.csv", 6,
               "faults/new,exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,1800,18,100,"
               "native,none,bf16,bf16,fp32,1");
  std::ostringstream out;
  compare_runs(two_runs.a.string(), two_runs.b.string(), out);
  EXPECT_NE(out.str().find("### Only in A (removed)\n\n- faults/crash: FAIL (error)"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("### Only in B (added)\n\n- faults/new: PASS (identical)"), std::string::npos);
}

// --json: the same changes as the Markdown, as values a CI script reads without parsing a table.
TEST(ReportCompare, JsonHoldsTheSameChangesAsValues) {
  TwoRuns two_runs;
  replace_line(two_runs.b / "summary.csv", 6,
               "faults/new,exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,1800,18,100,"
               "native,none,bf16,bf16,fp32,1");
  std::ostringstream out;
  EXPECT_EQ(compare_runs(two_runs.a.string(), two_runs.b.string(), out, /*json=*/true), 1);
  const nlohmann::json comparison = nlohmann::json::parse(out.str());
  EXPECT_EQ(comparison["schema_version"], 1);
  EXPECT_EQ(comparison["a"]["dir"], two_runs.a.string());
  EXPECT_EQ(comparison["a"]["scenarios"], 5);
  EXPECT_EQ(comparison["a"]["failed"], 1);   // faults/crash
  EXPECT_EQ(comparison["b"]["scenarios"], 5);
  EXPECT_EQ(comparison["b"]["failed"], 1);   // the regression; faults/crash is gone
  EXPECT_EQ(comparison["regressions"], 1);
  EXPECT_EQ(comparison["fixed"], 0);
  ASSERT_EQ(comparison["verdicts"].size(), 1u) << comparison.dump(2);
  const auto& verdict_change = comparison["verdicts"][0];
  EXPECT_EQ(verdict_change["scenario"], "states/exp_avg=bf16,policy=per_key");
  EXPECT_EQ(verdict_change["change"], "regression");
  EXPECT_EQ(verdict_change["a"]["passed"], true);
  EXPECT_EQ(verdict_change["a"]["outcome"], "identical");
  EXPECT_EQ(verdict_change["b"]["passed"], false);
  EXPECT_EQ(verdict_change["b"]["outcome"], "diverged");
  EXPECT_NE(verdict_change["b"]["verdict"].get<std::string>().find("FAIL: expected bit-exact resume"),
            std::string::npos);
  ASSERT_EQ(comparison["first_divergences"].size(), 1u);
  EXPECT_TRUE(comparison["first_divergences"][0]["a"].is_null());
  EXPECT_EQ(comparison["first_divergences"][0]["b"], "iteration 5: metric lm_loss");
  ASSERT_EQ(comparison["checkpoint_bytes"].size(), 1u);
  EXPECT_EQ(comparison["checkpoint_bytes"][0]["a"], 1800);
  EXPECT_EQ(comparison["checkpoint_bytes"][0]["b"], 1900);
  EXPECT_NEAR(comparison["checkpoint_bytes"][0]["change_percent"].get<double>(), 100.0 / 18.0, 1e-9);
  ASSERT_EQ(comparison["only_in_a"].size(), 1u);
  EXPECT_EQ(comparison["only_in_a"][0]["scenario"], "faults/crash");
  EXPECT_EQ(comparison["only_in_a"][0]["outcome"], "error");
  ASSERT_EQ(comparison["only_in_b"].size(), 1u);
  EXPECT_EQ(comparison["only_in_b"][0]["scenario"], "faults/new");
  EXPECT_EQ(comparison["only_in_b"][0]["passed"], true);

  std::ostringstream same;
  EXPECT_EQ(compare_runs(two_runs.a.string(), two_runs.a.string(), same, /*json=*/true), 0);
  const nlohmann::json same_comparison = nlohmann::json::parse(same.str());
  EXPECT_EQ(same_comparison["regressions"], 0);
  for (const char* k : {"verdicts", "first_divergences", "checkpoint_bytes", "only_in_a", "only_in_b"})
    EXPECT_TRUE(same_comparison[k].is_array() && same_comparison[k].empty()) << k;
}

// The command line: report --compare A B --json prints the object on stdout with the same exit
// code; --json without --compare is refused in one line.
TEST(ReportCli, CompareJsonOnStdoutWithTheSameExitCode) {
  TwoRuns two_runs;
  const fs::path logs = rh::testutil::fresh_dir("report_cli", "json");
  const auto compare =
      rh::testutil::run_tool_split({"report", "--compare", two_runs.a.string(), two_runs.b.string(), "--json"},
                                   logs / "compare.json", logs / "compare.err");
  const std::string& text = compare.log;
  EXPECT_EQ(compare.code, 1) << text << compare.err;
  const nlohmann::json comparison = nlohmann::json::parse(text);
  EXPECT_EQ(comparison["regressions"], 1);
  EXPECT_EQ(comparison["verdicts"][0]["change"], "regression");
  const auto alone = rh::testutil::run_logged(rh::testutil::tool_argv({"report", two_runs.a.string(), "--json"}),
                                              logs / "json_alone.log");
  EXPECT_EQ(alone.code, 2);
  EXPECT_EQ(alone.log, "resume-harness: error: report: --json needs --compare RUN_A RUN_B\n");
  fs::remove_all(logs);
}

// The command line: report RUN_DIR, report --compare A B, and exit codes 0 / 1 / 2.
TEST(ReportCli, ExitCodes) {
  TwoRuns two_runs;
  const fs::path logs = rh::testutil::fresh_dir("report_cli", "exit_codes");
  auto run = [&logs](std::vector<std::string> args) {
    args.insert(args.begin(), "report");
    return rh::testutil::run_logged(rh::testutil::tool_argv(args), logs / "log", 600, {{"RH_PYTHON", "/bin/false"}})
        .code;
  };
  EXPECT_EQ(run({two_runs.a.string()}), 0);
  EXPECT_TRUE(fs::exists(two_runs.a / "report.html"));
  EXPECT_EQ(run({"--compare", two_runs.a.string(), two_runs.b.string()}), 1);
  EXPECT_EQ(run({"--compare", two_runs.a.string(), two_runs.a.string()}), 0);
  EXPECT_EQ(run({(two_runs.a / "missing").string()}), 2);
  EXPECT_EQ(run({}), 2);
  // The help names what --compare and --merge take, not CLI11's "TEXT x 2".
  const auto help_run = rh::testutil::run_logged(rh::testutil::tool_argv({"report", "--help"}), logs / "help", 600);
  EXPECT_EQ(help_run.code, 0);
  const std::string& help = help_run.log;
  EXPECT_NE(help.find("--compare RUN_A RUN_B"), std::string::npos) << help;
  EXPECT_NE(help.find("--merge OUT_DIR SHARD_DIR..."), std::string::npos) << help;
  EXPECT_EQ(help.find(" x 2"), std::string::npos) << help;
  fs::remove_all(logs);
}

// summary.json nested 200,000 levels deep made `report` die with SIGSEGV; a
// models file with a 50,000-part key did the same in toml++. Both refused before parsing.
TEST_F(NoPlots, DeeplyNestedSummaryJsonOrModelsKeyIsRefused) {
  const auto dir = report_fixture::temp_dir("deep");
  report_fixture::write_run(dir);
  report_fixture::write(dir / "summary.json", std::string(200000, '[') + std::string(200000, ']'));
  std::ostringstream log;
  try {
    generate_report(dir.string(), "", log);
    FAIL() << "accepted";
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("summary.json:1: nesting deeper than 64 levels"), std::string::npos)
        << e.what();
  }
  report_fixture::write_run(dir);
  std::string key = "a";
  for (int i = 0; i < 50000; ++i) key += ".a";
  report_fixture::write(dir / "m.toml", "[[model]]\n" + key + " = 1\n");
  try {
    generate_report(dir.string(), (dir / "m.toml").string(), log);
    FAIL() << "accepted";
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("m.toml:2: column 128: a key or table header of more than 64"),
              std::string::npos)
        << std::string(e.what()).substr(0, 300);
  }
  fs::remove_all(dir);
}

}   // namespace

// ---- The run directory's own files read back, and summary.json as hostile input ----

namespace {

// A failure text with a line break, a quote and a comma, written as the harness writes summary.csv
// (csv_field, RFC 4180), is read back unchanged and the report is written: the line-based reader
// used to fail on the matrix's own summary.csv.
TEST_F(NoPlots, SummaryCsvWithLineBreaksInAFailureTextReadsBack) {
  const auto dir = report_fixture::temp_dir("csv_newline");
  report_fixture::write_run(dir);
  const std::string verdict = "FAIL: error: baseline exited with 2:\nresume-harness: error: \"x\", line 3\r\nmore";
  const std::string divergence = "iteration 4,\n\"lm_loss\"";
  std::string csv = slurp(dir / "summary.csv");
  const std::string old_row = "faults/crash,exact,0,error,";
  const size_t at = csv.find(old_row);
  ASSERT_NE(at, std::string::npos);
  csv = csv.substr(0, at) + "faults/crash,exact,0,error," + rh::csv_field(verdict) + "," + rh::csv_field(divergence) +
        ",0,,,,,,,0,0,0,native,none,bf16,bf16,fp32,0.5\n";
  report_fixture::write(dir / "summary.csv", csv);
  const auto rows = read_summary_csv((dir / "summary.csv").string());
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[4].scenario, "faults/crash");
  EXPECT_EQ(rows[4].verdict, verdict);
  EXPECT_EQ(rows[4].first_divergence, divergence);
  EXPECT_EQ(rows[4].line, 6u);
  std::ostringstream out;
  testing::internal::CaptureStderr();
  const int code = rh::write_report(dir.string(), out);
  const std::string err = testing::internal::GetCapturedStderr();   // always: one capturer at a time
  EXPECT_EQ(code, 0) << err;
  fs::remove_all(dir);
}

// An external cell's diagnosis (summary.csv's external, diagnosis and explanation columns) reaches
// report.md's list of failing scenarios; a summary.csv written before those columns still reads.
TEST_F(NoPlots, AFailingExternalCellShowsItsDiagnosisInTheReport) {
  const auto dir = report_fixture::temp_dir("external_diagnosis");
  report_fixture::write_run(dir);
  std::string csv = slurp(dir / "summary.csv");
  const size_t header_end = csv.find('\n');
  std::string out = csv.substr(0, header_end) + ",external,diagnosis,explanation\n";
  for (size_t at = header_end + 1; at < csv.size();) {
    const size_t end = csv.find('\n', at);
    const std::string row = csv.substr(at, end - at);
    const bool failing = row.rfind("faults/crash,", 0) == 0;
    out += row + (failing ? ",1,not-restored,\"iteration 11: metric loss (1 vs 2), after resume\"" : ",0,,") + "\n";
    at = end + 1;
  }
  report_fixture::write(dir / "summary.csv", out);
  const auto rows = read_summary_csv((dir / "summary.csv").string());
  size_t external = 0;
  for (const auto& row : rows) external += row.external ? 1 : 0;
  EXPECT_EQ(external, 1u);
  std::ostringstream log;
  testing::internal::CaptureStderr();
  const int code = rh::write_report(dir.string(), log);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_EQ(code, 0) << err;
  const std::string md = slurp(dir / "report.md");
  EXPECT_NE(md.find("diagnosis not-restored: iteration 11: metric loss (1 vs 2), after resume"), std::string::npos)
      << md;
  fs::remove_all(dir);
}

// summary.json names each scenario's directory: one outside the run directory is refused (it was
// read wherever it pointed), and so is a key named twice.
struct BadSummary {
  const char* name;
  std::string from, to;   // replaced in summary.json
  std::string expect;
};
class HostileSummaryJson : public NoPlots, public ::testing::WithParamInterface<BadSummary> {};
TEST_P(HostileSummaryJson, IsRefusedNamingTheFileAndTheDir) {
  const auto dir = report_fixture::temp_dir(std::string("summary_") + GetParam().name);
  report_fixture::write_run(dir);
  std::string summary_text = slurp(dir / "summary.json");
  const size_t at = summary_text.find(GetParam().from);
  ASSERT_NE(at, std::string::npos);
  summary_text.replace(at, GetParam().from.size(), GetParam().to);
  report_fixture::write(dir / "summary.json", summary_text);
  try {
    (void)load_run(dir.string());
    ADD_FAILURE() << "accepted " << GetParam().to;
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "summary.json").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(GetParam().expect), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
INSTANTIATE_TEST_SUITE_P(
    Round4, HostileSummaryJson,
    ::testing::Values(
        BadSummary{"DirAbsolute", R"("dir":"scenarios/faults__crash")", R"("dir":"/etc")", "dir '/etc' is absolute"},
        BadSummary{"DirDotDot", R"("dir":"scenarios/faults__crash")", R"("dir":"scenarios/../../..")",
                   "has a '..' part"},
        BadSummary{"DirEmptyPart", R"("dir":"scenarios/faults__crash")", R"("dir":"scenarios//x")", "has a '' part"},
        BadSummary{"DirEmpty", R"("dir":"scenarios/faults__crash")", R"("dir":"")", "is empty"},
        BadSummary{"DuplicateKey", R"("failed":1,)", R"("failed":1,"failed":0,)", "duplicate key 'failed'"}),
    [](const auto& i) { return std::string(i.param.name); });

}   // namespace
