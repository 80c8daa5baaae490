// The report on a hand-written fixture run (tests/report_fixture.h): every file is produced, the
// PNGs are valid images of sensible size, the HTML is self-contained, the numbers in the tables
// are the CSV's numbers, the fp32 reference is the right checkpoint, and the projection matches
// a hand-computed case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "report_fixture.h"
#include "reports/document.h"
#include "reports/projection.h"
#include "reports/report.h"
#include "reports/report_writer.h"
#include "harness/verify/scenario_name.h"

namespace {

namespace fs = std::filesystem;
using namespace rh::report;

using report_fixture::slurp;

// Splits one CSV line honouring double quotes (the test's own reader, independent of fccp).
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool q = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (q && c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
    else if (c == '"') q = !q;
    else if (c == ',' && !q) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// The cells of the markdown table row that starts with `first`.
std::vector<std::string> md_row(const std::string& md, const std::string& first) {
  std::istringstream in(md);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| " + first + " |", 0) != 0) continue;
    std::vector<std::string> cells;
    size_t pos = 1;
    while (pos < line.size()) {
      const size_t end = line.find(" |", pos);
      if (end == std::string::npos) break;
      cells.push_back(line.substr(pos + 1, end - pos - 1));
      pos = end + 2;
    }
    return cells;
  }
  return {};
}

struct Png {
  bool valid = false;
  uint32_t width = 0, height = 0;
};

Png read_png(const fs::path& png_path) {
  const std::string png_bytes = slurp(png_path);
  Png png;
  static const std::string sig("\x89PNG\r\n\x1a\n", 8);
  if (png_bytes.size() < 33 || png_bytes.compare(0, 8, sig) != 0 || png_bytes.compare(12, 4, "IHDR") != 0) return png;
  auto be32 = [&](size_t o) {
    return (uint32_t(uint8_t(png_bytes[o])) << 24) | (uint32_t(uint8_t(png_bytes[o + 1])) << 16) |
           (uint32_t(uint8_t(png_bytes[o + 2])) << 8) | uint32_t(uint8_t(png_bytes[o + 3]));
  };
  png.valid = png_bytes.compare(png_bytes.size() - 8, 4, "IEND") == 0;
  png.width = be32(16);
  png.height = be32(20);
  return png;
}

// One report with real plots, shared by the tests that read it (plotting takes seconds).
class ReportOnFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    unsetenv("RH_PYTHON");
    dir_ = new fs::path(report_fixture::temp_dir("full"));
    report_fixture::write_run(*dir_);
    report_fixture::write_models(*dir_ / "models.toml");
    std::ostringstream log;
    files_ = new ReportFiles(generate_report(dir_->string(), (*dir_ / "models.toml").string(), log));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete files_;
  }
  static fs::path* dir_;
  static ReportFiles* files_;
};
fs::path* ReportOnFixture::dir_ = nullptr;
ReportFiles* ReportOnFixture::files_ = nullptr;

TEST_F(ReportOnFixture, EveryFileIsProducedAndPngsAreValid) {
  ASSERT_TRUE(files_->plots.ok) << files_->plots.message;
  EXPECT_TRUE(fs::exists(*dir_ / "report.md"));
  EXPECT_TRUE(fs::exists(*dir_ / "report.html"));
  EXPECT_TRUE(fs::exists(*dir_ / "plots" / "index.csv"));
  EXPECT_TRUE(fs::exists(*dir_ / "plots" / "storage.csv"));
  for (const char* name : {kLossPlot, kDlossPlot, kDiskPlot, kUlpPlot}) {
    const auto png = read_png(*dir_ / "plots" / name);
    EXPECT_TRUE(png.valid) << name;
    EXPECT_GT(png.width, 200u) << name;
    EXPECT_GT(png.height, 200u) << name;
  }
}

TEST_F(ReportOnFixture, HtmlIsSelfContained) {
  const std::string html = slurp(*dir_ / "report.html");
  size_t images = 0;
  for (size_t p = html.find("src=\"data:image/png;base64,"); p != std::string::npos;
       p = html.find("src=\"data:image/png;base64,", p + 1))
    ++images;
  EXPECT_EQ(images, 4u);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("<style>"), std::string::npos);
  // The embedded image is the PNG on disk, base64-encoded.
  const std::string b64 = base64(slurp(*dir_ / "plots" / kLossPlot));
  EXPECT_NE(html.find(b64), std::string::npos);
}

// The first screen: the verdict, then the scenarios that did not meet their expectation (here
// only faults/crash) with what diverged first and the command that reruns it, before the key
// findings; per-group lines count "met expectation" and "bit-exact" apart.
TEST_F(ReportOnFixture, FailingScenariosComeFirstWithReproduceCommands) {
  const std::string md = slurp(*dir_ / "report.md"), html = slurp(*dir_ / "report.html");
  const size_t list = md.find("## Scenarios that did not meet their expectation");
  ASSERT_NE(list, std::string::npos);
  const size_t findings = md.find("## Key findings");
  ASSERT_NE(findings, std::string::npos);
  EXPECT_LT(list, findings);
  const std::string section = md.substr(list, md.find("\n## ", list + 1) - list);
  EXPECT_NE(section.find("faults/crash (expected exact, found error): first divergence baseline process exited "
                         "with 134, core dumped; reproduce: resume-harness check --file 'scenarios/fixture.toml' "
                         "'faults/crash'"),
            std::string::npos)
      << section;
  EXPECT_EQ(section.find("faults/skip=exp_avg"), std::string::npos) << "a scenario that met its expectation is listed";
  EXPECT_EQ(section.find("states/"), std::string::npos);
  EXPECT_NE(md.find("- faults: 1 of 2 met their expectation, 0 bit-exact"), std::string::npos);
  EXPECT_NE(md.find("- states: 3 of 3 met their expectation, 3 bit-exact"), std::string::npos);
  EXPECT_NE(html.find("Scenarios that did not meet their expectation"), std::string::npos);
  EXPECT_LT(html.find("faults/crash (expected exact"), html.find("Key findings"));
}

// Outcome grids from the canonical names: states has axes exp_avg (rows) x policy (columns),
// with a hole where no scenario has that combination; a fault caught as declared is "diverged as
// expected", never coloured as a failure; the failure is; hover text names verdict and divergence.
TEST_F(ReportOnFixture, OutcomeGridsFollowTheAxesAndSeparateExpectedDivergence) {
  RunData run = load_run(dir_->string());
  const auto grids = outcome_grids(run);
  ASSERT_EQ(grids.size(), 2u);
  const Table& states_grid = grids[0].table;
  EXPECT_EQ(grids[0].group, "states");
  EXPECT_EQ(states_grid.header, (std::vector<std::string>{"exp_avg \\ policy", "policy=fp32", "policy=per_key"}));
  ASSERT_EQ(states_grid.rows.size(), 2u);
  EXPECT_EQ(states_grid.rows[0], (std::vector<std::string>{"fp32", "identical", "\u2014"}));
  EXPECT_EQ(states_grid.rows[1], (std::vector<std::string>{"bf16", "identical", "identical"}));
  EXPECT_EQ(states_grid.cell_class[0][2], "o-none");
  const Table& faults_grid = grids[1].table;
  EXPECT_EQ(grids[1].group, "faults");
  ASSERT_EQ(faults_grid.rows.size(), 2u);
  // Two axes, each named by one scenario only: both label the rows, as axis=value.
  EXPECT_EQ(faults_grid.header, (std::vector<std::string>{"skip, scenario", "outcome"}));
  EXPECT_EQ(faults_grid.rows[0], (std::vector<std::string>{"skip=exp_avg", "diverged as expected"}));
  EXPECT_EQ(faults_grid.rows[1], (std::vector<std::string>{"scenario=crash", "failed"}));
  EXPECT_EQ(faults_grid.cell_class[0][1], "o-diverged-as-expected");
  EXPECT_EQ(faults_grid.cell_class[1][1], "o-failed");
  EXPECT_NE(faults_grid.cell_title[0][1].find("first divergence: after load: w/exp_avg"), std::string::npos)
      << faults_grid.cell_title[0][1];
  const std::string html = slurp(*dir_ / "report.html");
  EXPECT_NE(html.find("<td class=\"o-failed\" title=\"faults/crash: FAIL: error: baseline process exited with 134"),
            std::string::npos);
  EXPECT_NE(html.find("td.o-failed{"), std::string::npos);   // the colours are defined
}

// Key findings are not repeated per policy: per_key and native store the same dtypes in the
// fixture (BF16 moments), so they project the same bytes and share one line per model.
TEST_F(ReportOnFixture, KeyFindingsShareOneLinePerModelAndDtypes) {
  const std::string md = slurp(*dir_ / "report.md");
  const size_t at = md.find("## Key findings");
  ASSERT_NE(at, std::string::npos);
  std::istringstream in(md.substr(at, md.find("<details>", at) - at));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (l.rfind("- ", 0) == 0) lines.push_back(l);
  size_t shared = 0;
  std::set<std::string> seen;
  for (const auto& l : lines) {
    if (l.find("projected") == std::string::npos) continue;
    const size_t open = l.find(" (polic"), close = l.find(')', open);
    ASSERT_NE(open, std::string::npos) << l;
    const std::string without_policies = l.substr(0, open) + l.substr(close + 1);
    EXPECT_TRUE(seen.insert(without_policies).second) << "repeated: " << l;
    if (l.find("(policies per_key, native)") != std::string::npos) ++shared;
  }
  EXPECT_EQ(shared, 1u) << md.substr(at, 2000);   // only DeepSeek-V2-Lite has published sizes
}

// The verdict comes before everything: report.html opens its body with the status banner, report.md
// puts the same line under its title, and the counts add up (fixture: 3 bit-exact, 1 fault caught,
// 1 errored).
TEST_F(ReportOnFixture, StatusBannerOpensBothReportsWithCountsThatAddUp) {
  const std::string md = slurp(*dir_ / "report.md"), html = slurp(*dir_ / "report.html");
  const std::string line =
      "FAILED: 5 scenarios, 4 met their expectation (3 bit for bit, 0 within tolerance, "
      "1 diverged as declared, 0 refused as declared), 1 failed";
  const size_t body = html.find("<body>\n");
  ASSERT_NE(body, std::string::npos);
  EXPECT_EQ(html.find("<div id=\"status\" class=\"status fail\"><strong>"), body + 7) << html.substr(body, 200);
  EXPECT_NE(html.find("<strong>" + line + "</strong></div>\n<h1>"), std::string::npos) << html.substr(body, 400);
  EXPECT_EQ(md.find("**" + line + "**"), md.find("\n\n") + 2) << md.substr(0, 400);
  EXPECT_LT(md.find("**" + line + "**"), md.find("## Scenarios that did not meet their expectation"));

  RunData run = load_run(dir_->string());
  const StatusCounts counts = status_counts(run);
  EXPECT_EQ(counts.exact + counts.tolerance + counts.diverged + counts.refused, counts.met);
  EXPECT_EQ(counts.met + counts.failed, counts.scenarios);
  EXPECT_FALSE(counts.passed());
  // A scenario that met a declared refusal is counted as refused, one within tolerance as such.
  run.scenarios[0].row.outcome = rh::Outcome::load_refused;
  run.scenarios[1].row.outcome = rh::Outcome::within_tolerance;
  EXPECT_EQ(status_line(status_counts(run)),
            "FAILED: 5 scenarios, 4 met their expectation (1 bit for bit, 1 within tolerance, 1 diverged as declared, "
            "1 refused as declared), 1 failed");
}

// report.md as a PR comment or CI step summary: verdict, failures and key findings open, every
// later section folded in <details>, and no image link (a relative link breaks once posted)
// unless --md-image-links asks for them.
TEST_F(ReportOnFixture, MarkdownFoldsDetailsAndLinksNoImagesByDefault) {
  const std::string md = slurp(*dir_ / "report.md");
  const size_t failing = md.find("## Scenarios that did not meet their expectation");
  const size_t findings = md.find("## Key findings");
  const size_t first_fold = md.find("<details><summary>");
  ASSERT_NE(failing, std::string::npos);
  ASSERT_NE(first_fold, std::string::npos);
  EXPECT_LT(failing, findings);
  EXPECT_LT(findings, first_fold);
  EXPECT_EQ(md.find("\n## ", findings + 1), std::string::npos) << "a level-2 section outside a fold";
  for (const char* section : {"Outcomes", "Matrix", "Loss after resume", "Checkpoint size per key",
                              "Projection to real model sizes", "Scenario notes", "Environment"})
    EXPECT_NE(md.find(std::string("<details><summary>") + section + "</summary>\n\n"), std::string::npos) << section;
  size_t open = 0, close = 0;
  for (size_t p = md.find("<details>"); p != std::string::npos; p = md.find("<details>", p + 1)) ++open;
  for (size_t p = md.find("</details>"); p != std::string::npos; p = md.find("</details>", p + 1)) ++close;
  EXPECT_EQ(open, 7u);
  EXPECT_EQ(close, open);
  EXPECT_EQ(md.find("!["), std::string::npos);
  EXPECT_EQ(md.find("](plots/"), std::string::npos);
  EXPECT_NE(md.find("plots/" + std::string(kLossPlot) + " in the run directory"), std::string::npos);
  // The matrix table is still a table inside its fold.
  EXPECT_EQ(md_row(md, "faults/skip=exp_avg").size(), md_row(md, "states/exp_avg=fp32,policy=fp32").size());

  const fs::path dir = report_fixture::temp_dir("imagelinks");
  report_fixture::write_run(dir);
  std::ostringstream log;
  unsetenv("RH_PYTHON");
  generate_report(dir.string(), "", log, /*md_image_links=*/true);
  const std::string linked = slurp(dir / "report.md");
  for (const char* name : {kLossPlot, kDlossPlot, kDiskPlot, kUlpPlot})
    EXPECT_NE(linked.find(std::string("](plots/") + name + ")"), std::string::npos) << name;
  fs::remove_all(dir);
}

// Each matrix row of report.html links the scenario's directory, the one summary.json names for it
// and safe_name gives (scenarios/NAME, / as __, , as +), which holds its result.json.
TEST_F(ReportOnFixture, MatrixRowsLinkEachScenarioDirectory) {
  const std::string html = slurp(*dir_ / "report.html");
  const RunData run = load_run(dir_->string());
  size_t with_files = 0;
  for (const auto& s : run.scenarios) {
    EXPECT_EQ(s.rel_dir, "scenarios/" + rh::safe_name(s.row.scenario)) << s.row.scenario;
    // In its group's folded table (<details class="fold" id="group-states">) the name is shown
    // without "group/", with a line-break opportunity after each comma.
    std::string shown = rh::markup_escape(s.row.scenario.substr(s.row.scenario.find('/') + 1));
    for (size_t at = 0; (at = shown.find(',', at)) != std::string::npos; at += 6) shown.replace(at, 1, ",<wbr>");
    const size_t link = html.find("<a href=\"" + s.rel_dir + "/\">" + shown + "</a>");
    EXPECT_NE(html.find("<details class=\"fold\" id=\"group-" + s.group + "\""), std::string::npos) << s.group;
    if (!fs::exists(*dir_ / s.rel_dir)) {   // faults/crash wrote nothing: no link to a missing directory
      EXPECT_EQ(link, std::string::npos) << s.row.scenario;
      EXPECT_EQ(html.find("href=\"" + s.rel_dir), std::string::npos) << s.row.scenario;
      continue;
    }
    EXPECT_NE(link, std::string::npos) << s.row.scenario;
    ++with_files;
    const auto result = nlohmann::json::parse(slurp(*dir_ / s.rel_dir / "result.json"));
    EXPECT_EQ(result.at("name"), s.row.scenario);
  }
  EXPECT_EQ(with_files, 4u);
  // The matrix in report.html: the verdict is the outcome cell's hover text, not a column of its
  // own (sixteen columns do not fit 1280 px); report.md keeps the column.
  EXPECT_NE(html.find("<td title=\"PASS: difference caught as expected: after load: w/exp_avg\">diverged</td>"),
            std::string::npos);
  EXPECT_EQ(html.find("<th>verdict</th>"), std::string::npos);
  EXPECT_NE(html.find("<th>max ULP exp_<wbr>avg_<wbr>sq</th>"), std::string::npos);
  EXPECT_EQ(md_row(slurp(*dir_ / "report.md"), "faults/skip=exp_avg")[3],
            "PASS: difference caught as expected: after load: w/exp_avg");
  // A directory name that is not URL-safe is percent-encoded in the link, never left to end it.
  Table table;
  table.header = {"scenario"};
  table.rows = {{"x"}};
  table.row_href = {"scenarios/a\"b c#d/"};
  EXPECT_NE(to_html(table).find("<a href=\"scenarios/a%22b%20c%23d/\">x</a>"), std::string::npos) << to_html(table);
}

// Grids pick their columns by the axes' sizes: a group of four axes (2, 3, 2 and 4 values) gets at
// most kMaxGridColumns columns (here b x c = 6: the largest product that fits, ties to the later
// axes), its rows the rest (a x d = 8), and every scenario exactly one cell. A single-scenario
// group is one row naming the scenario.
TEST(ReportGrids, ColumnsFollowTheAxesSizesAndSingleScenarioGroupsAreNamed) {
  RunData run;
  auto add = [&run](const std::string& name, const std::string& group) {
    ScenarioData scenario;
    scenario.row.scenario = name;
    scenario.row.passed = true;
    scenario.row.outcome = rh::Outcome::identical;
    scenario.row.verdict = "PASS";
    scenario.group = group;
    run.scenarios.push_back(scenario);
  };
  add("seed-protocol", "seed-protocol");
  size_t wide_scenarios = 0;
  for (const char* a : {"x", "y"})
    for (const char* b : {"1", "2", "3"})
      for (const char* c : {"p", "q"})
        for (const char* d : {"k", "l", "m", "n"}) {
          add(std::string("wide/a=") + a + ",b=" + b + ",c=" + c + ",d=" + d, "wide");
          ++wide_scenarios;
        }
  const auto grids = outcome_grids(run);
  ASSERT_EQ(grids.size(), 2u);
  EXPECT_EQ(grids[0].table.header, (std::vector<std::string>{"scenario", "outcome"}));
  ASSERT_EQ(grids[0].table.rows.size(), 1u);
  EXPECT_EQ(grids[0].table.rows[0], (std::vector<std::string>{"seed-protocol", "identical"}));
  const Table& wide_grid = grids[1].table;
  EXPECT_TRUE(grids[1].note.empty());
  EXPECT_EQ(wide_grid.header.size() - 1, kMaxGridColumns);
  EXPECT_EQ(wide_grid.header[0], "a, d \\ b, c");
  EXPECT_EQ(wide_grid.header[1], "b=1, c=p");
  EXPECT_EQ(wide_grid.rows.size(), 8u);
  EXPECT_EQ(wide_grid.rows[0][0], "a=x, d=k");
  size_t cells = 0;
  for (const auto& r : wide_grid.rows)
    for (size_t c = 1; c < r.size(); ++c) cells += r[c] == "identical";
  EXPECT_EQ(cells, wide_scenarios);
}

// Without --models the projection reads the tool's own models.toml, wherever it is installed; the
// report names it reports/models.toml, so two machines' reports of one run read alike.
TEST(ReportDefaultModels, NamesTheShippedFileNotWhereItIsInstalled) {
  const fs::path dir = report_fixture::temp_dir("defaultmodels");
  report_fixture::write_run(dir);
  std::ostringstream log;
  generate_report(dir.string(), "", log, /*md_image_links=*/false, /*verbose=*/true);
  ASSERT_TRUE(fs::exists(default_models_file())) << default_models_file();
  const std::string installed = fs::absolute(default_models_file()).string();
  EXPECT_NE(log.str().find(default_models_file()), std::string::npos) << log.str();   // -v says where it read
  for (const char* name : {"report.md", "report.html"}) {
    const std::string text = report_fixture::slurp(dir / name);
    EXPECT_NE(text.find("(models from reports/models.toml)"), std::string::npos) << name;
    EXPECT_EQ(text.find(installed), std::string::npos) << name << " names " << installed;
    EXPECT_EQ(text.find("/share/resume-harness/"), std::string::npos) << name;
  }
  fs::remove_all(dir);
}

TEST(ReportFailingList, SaysNoneWhenEveryScenarioMetItsExpectation) {
  const fs::path dir = report_fixture::temp_dir("allpass");
  report_fixture::write_run(dir);
  std::string csv = report_fixture::summary_csv();
  csv = csv.substr(0, csv.find("faults/crash"));   // drop the failing row
  report_fixture::write(dir / "summary.csv", csv);
  report_fixture::write_models(dir / "models.toml");
  std::ostringstream log;
  generate_report(dir.string(), (dir / "models.toml").string(), log);
  const std::string md = report_fixture::slurp(dir / "report.md");
  EXPECT_NE(md.find("None: every scenario met its expectation."), std::string::npos);
  EXPECT_EQ(md.find("reproduce:"), std::string::npos);
  EXPECT_NE(md.find("**PASSED: 4 scenarios, 4 met their expectation"), std::string::npos);
  EXPECT_NE(report_fixture::slurp(dir / "report.html").find("<div id=\"status\" class=\"status pass\">"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST_F(ReportOnFixture, MatrixTableNumbersAreTheCsvNumbers) {
  const std::string md = slurp(*dir_ / "report.md"), html = slurp(*dir_ / "report.html");
  std::istringstream csv(report_fixture::summary_csv());
  std::string line;
  std::getline(csv, line);
  const auto header = split_csv(line);
  auto col = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  size_t rows = 0;
  while (std::getline(csv, line)) {
    const auto fields = split_csv(line);
    const auto cells = md_row(md, fields[col("scenario")]);
    // 6 + the 4 ULP kinds some checkpoint holds (no remainder, no scale in the fixture) + 3.
    ASSERT_EQ(cells.size(), 13u) << fields[0];
    SCOPED_TRACE(fields[0]);
    EXPECT_EQ(cells[1], fields[col("expectation")]);
    EXPECT_EQ(cells[2], fields[col("outcome")]);
    EXPECT_EQ(cells[3], fields[col("verdict")]);
    // People's numbers: 0 as 0, the rest to 4 significant digits (the CSV keeps every digit).
    if (fields[col("outcome")] != "error") {
      EXPECT_EQ(cells[5], fields[col("max_abs_dloss")] == "0" ? "0" : "0.007812") << fields[col("max_abs_dloss")];
    }
    const char* kinds[] = {"model", "master_param", "exp_avg", "exp_avg_sq"};
    for (size_t k = 0; k < 4; ++k) {
      const std::string max_ulp = fields[col(std::string("max_ulp_") + kinds[k])];
      EXPECT_EQ(cells[6 + k], max_ulp.empty() ? "\u2014" : max_ulp) << kinds[k];
    }
    EXPECT_EQ(cells[10], fields[col("checkpoint_bytes")]);
    EXPECT_EQ(cells[11], fields[col("bytes_per_param")]);
    // The HTML holds the same cells.
    EXPECT_NE(html.find("<td class=\"num\">" + fields[col("checkpoint_bytes")] + "</td><td class=\"num\">" +
                        fields[col("bytes_per_param")] + "</td>"),
              std::string::npos);
    ++rows;
  }
  EXPECT_EQ(rows, 5u);
  EXPECT_EQ(md.find("max ULP remainder"), std::string::npos);
  EXPECT_EQ(md.find("max ULP scale"), std::string::npos);
  // Reductions vs the fp32 checkpoint of the same config: 1 - 1800/2400.
  EXPECT_EQ(md_row(md, "states/exp_avg=fp32,policy=fp32").back(), "reference");
  EXPECT_EQ(md_row(md, "states/exp_avg=bf16,policy=fp32").back(), "reference");
  EXPECT_EQ(md_row(md, "states/exp_avg=bf16,policy=per_key").back(), "25.00 %");
  EXPECT_EQ(md_row(md, "faults/skip=exp_avg").back(), "25.00 %");
  EXPECT_EQ(md_row(md, "faults/crash").back(), "\u2014");
}

TEST_F(ReportOnFixture, DiskTableSumsDiskCsvPerKind) {
  const std::string md = slurp(*dir_ / "report.md");
  const auto per_key_row = md_row(md, "per_key: model BF16, master_param F32, exp_avg BF16, exp_avg_sq BF16");
  ASSERT_EQ(per_key_row.size(), 12u);
  EXPECT_EQ(per_key_row[1], "states/exp_avg=bf16,policy=per_key");
  const std::vector<std::string> want = {"200",    "400", "\u2014", "200",     "200",
                                         "\u2014", "500", "1500",   "10.0000", "21.05 %"};   // 1 - 1500/1900
  EXPECT_EQ(std::vector<std::string>(per_key_row.begin() + 2, per_key_row.end()), want);
  EXPECT_EQ(md_row(md, "fp32: model BF16, master_param F32, exp_avg F32, exp_avg_sq F32").back(), "reference");
}

TEST_F(ReportOnFixture, ProjectionMatchesHandComputedCase) {
  const std::string md = slurp(*dir_ / "report.md");
  // 100 params: fp32 states 1400 payload bytes = 14 B/param; bf16 moments 1000 = 10 B/param.
  // DeepSeek-V2-Lite: 14 * 15.7e9 = 219.8e9 (published 222: -0.99 %); 10 * 15.7e9 = 157e9
  // (published 164: -4.27 %); reduction 1 - 10/14 = 28.571 % vs 1 - 164/222 = 26.126 %: +2.445 pp.
  std::istringstream in(md);
  std::string line;
  std::vector<std::vector<std::string>> ds;
  while (std::getline(in, line))
    if (line.rfind("| DeepSeek-V2-Lite |", 0) == 0) ds.push_back(md_row(line, "DeepSeek-V2-Lite"));
  ASSERT_EQ(ds.size(), 3u);   // one row per save policy: fp32, per_key, native
  const std::vector<std::string> fp32 = {"DeepSeek-V2-Lite",
                                         "15.7 B",
                                         "fp32",
                                         "1",
                                         "219.8",
                                         "model BF16, master_param F32, exp_avg F32, exp_avg_sq F32",
                                         "fp32 states: published 222.0 GB, projected 219.8 (-1.0 %)"};
  const std::vector<std::string> bf16 =
      {"DeepSeek-V2-Lite",
       "15.7 B",
       "per_key",
       "1",
       "157.0",
       "model BF16, master_param F32, exp_avg BF16, exp_avg_sq BF16",
       "bf16 states: published 164.0 GB, projected 157.0 (-4.3 %); reduction 28.57 % vs 26.13 % (+2.45 pp)"};
  EXPECT_EQ(ds[0], fp32);
  EXPECT_EQ(ds[1], bf16);
  EXPECT_EQ(ds[2][2], "native");
  EXPECT_EQ(ds[2].back().rfind("bf16 states: published 164.0 GB", 0), 0u);   // native stores the same dtypes
  // Models are listed by parameter count: DeepSeek-V2-Lite (15.7e9) before Big (100e9).
  EXPECT_LT(md.find("| DeepSeek-V2-Lite |"), md.find("| Big |"));
  EXPECT_NE(md.find("| Big | 100 B | fp32 | 1 | 1400.0 |"), std::string::npos);

  // projection.csv: every model x configuration at full precision.
  std::istringstream csv(slurp(*dir_ / "projection.csv"));
  std::getline(csv, line);
  EXPECT_EQ(line.rfind("model,params,policy,storage,payload_bytes_per_param,projected_bytes,", 0), 0u);
  size_t projection_rows = 0;
  bool saw_per_key = false;
  while (std::getline(csv, line)) {
    ++projection_rows;
    if (line.rfind("DeepSeek-V2-Lite,15700000000,per_key,", 0) == 0) {
      saw_per_key = true;
      EXPECT_NE(line.find(",10,157000000000,157,"), std::string::npos) << line;
      EXPECT_NE(line.find(",164,"), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(saw_per_key);
  EXPECT_EQ(projection_rows, 2u * 3u);   // 2 models x 3 configurations
}

TEST(ReportProjection, ArithmeticOnCombos) {
  Combo fp32, bf16;
  fp32.dtypes = {{"model", "BF16"}, {"master_param", "F32"}, {"exp_avg", "F32"}, {"exp_avg_sq", "F32"}};
  fp32.num_params = 7;
  fp32.payload_per_param = 14;
  fp32.has_reduction = true;
  bf16 = fp32;
  bf16.dtypes["exp_avg"] = bf16.dtypes["exp_avg_sq"] = "BF16";
  bf16.payload_per_param = 10;
  bf16.payload_reduction_pct = 100.0 * (1 - 10.0 / 14.0);
  ModelSize model_size{"DeepSeek-V2-Lite", 15.7e9, {{"fp32", 222, ""}, {"bf16", 164, ""}}};
  const auto rows = project({model_size}, {fp32, bf16});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].bytes, 219.8e9);
  EXPECT_EQ(rows[1].bytes, 157e9);
  ASSERT_NE(rows[1].published, nullptr);
  EXPECT_EQ(rows[1].published->gb, 164);
  EXPECT_NEAR(rows[1].published_diff_pct, 100.0 * (157.0 - 164.0) / 164.0, 1e-12);   // float rounding only
  EXPECT_NEAR(rows[1].delta_pp, 100.0 * (1 - 10.0 / 14.0) - 100.0 * (1 - 164.0 / 222.0), 1e-12);
  // A remainder checkpoint is not what was published.
  auto remainder_combo = bf16;
  remainder_combo.dtypes.erase("master_param");
  remainder_combo.dtypes["remainder"] = "I16";
  EXPECT_FALSE(published_applies(model_size.published[1], remainder_combo));
}

// A compressed checkpoint of the same dtypes is its own configuration: grouped as "POLICY + zstd",
// projected with its own (smaller) bytes per parameter, and never compared with a published
// (uncompressed) size.
TEST(ReportProjection, CompressedCombosAreTheirOwnRowsWithoutPublishedSizes) {
  Combo plain;
  plain.policy = "native";
  plain.label = "native: model BF16, exp_avg BF16";
  plain.dtypes = {{"model", "BF16"}, {"master_param", "F32"}, {"exp_avg", "BF16"}, {"exp_avg_sq", "BF16"}};
  plain.num_params = 10;
  plain.payload_per_param = 10;
  Combo zstd_combo = plain;
  zstd_combo.compress = "zstd";
  zstd_combo.label = "native + zstd: model BF16, exp_avg BF16";
  zstd_combo.payload_per_param = 6.5;
  EXPECT_EQ(zstd_combo.policy_label(), "native + zstd");
  EXPECT_EQ(plain.policy_label(), "native");
  ModelSize model_size{"DeepSeek-V2-Lite", 15.7e9, {{"fp32", 222, ""}, {"bf16", 164, ""}}};
  EXPECT_TRUE(published_applies(model_size.published[1], plain));
  EXPECT_FALSE(published_applies(model_size.published[1], zstd_combo));
  const auto rows = project({model_size}, {plain, zstd_combo});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NE(rows[0].published, nullptr);
  EXPECT_EQ(rows[1].published, nullptr);
  EXPECT_EQ(rows[1].bytes, 6.5 * 15.7e9);
  const Table table = projection_table({model_size}, {plain, zstd_combo}, rows);
  ASSERT_EQ(table.rows.size(), 2u);   // one row per model and policy label
  EXPECT_EQ(table.rows[0][2], "native");
  EXPECT_EQ(table.rows[1][2], "native + zstd");
  EXPECT_EQ(table.rows[1][4], "102.0");    // 6.5 B/param x 15.7e9 = 102.05 GB
  EXPECT_EQ(table.rows[1][6], "\u2014");   // no published size applies
}

// storage_combos: two scenarios whose files hold the same dtypes, one of them compressed, are two
// configurations (before, the compressed one was merged into the uncompressed label).
TEST(ReportProjection, StorageCombosKeepACompressedCheckpointApart) {
  RunData run;
  for (const char* compress : {"none", "zstd"}) {
    ScenarioData scenario;
    scenario.row.scenario = std::string("states/compress=") + compress;
    scenario.row.save_policy = "native";
    scenario.row.compress = compress;
    scenario.row.num_params = Num{"100", 100};
    scenario.has_disk = true;
    const uint64_t model_bytes = std::string(compress) == "none" ? 200 : 130,
                   exp_avg_bytes = std::string(compress) == "none" ? 200 : 140;
    scenario.disk = {{"model.safetensors", "w", "model", "BF16", 100, model_bytes},
                     {"optim_rank_00000.safetensors", "w/exp_avg", "exp_avg", "BF16", 100, exp_avg_bytes},
                     {"optim_rank_00000.safetensors", "header", "metadata", "", 0, 64}};
    run.scenarios.push_back(scenario);
  }
  const auto combos = storage_combos(run, {-1, -1});
  ASSERT_EQ(combos.size(), 2u);
  EXPECT_EQ(combos[0].label, "native: model BF16, exp_avg BF16");
  EXPECT_EQ(combos[1].label, "native + zstd: model BF16, exp_avg BF16");
  EXPECT_EQ(combos[0].payload_per_param, 4.0);   // (200 + 200) / 100, the header left out
  EXPECT_EQ(combos[1].payload_per_param, 2.7);   // (130 + 140) / 100
  EXPECT_EQ(combos[1].compress, "zstd");
}

TEST(ReportModels, DefaultFileListsDeepSeekWithPublishedSizes) {
  const auto models = load_models(default_models_file());
  const ModelSize* ds = nullptr;
  for (const auto& m : models) ds = m.name == "DeepSeek-V2-Lite" ? &m : ds;
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->params, 15.7e9);
  ASSERT_EQ(ds->published.size(), 2u);
  EXPECT_EQ(ds->published[0].gb, 222);
  EXPECT_EQ(ds->published[1].gb, 164);
  for (size_t i = 1; i < models.size(); ++i) EXPECT_LE(models[i - 1].params, models[i].params);
}

TEST(ReportReferences, Fp32SaveWithOverrideIsNotTheReference) {
  const auto dir = report_fixture::temp_dir("override");
  report_fixture::write_run(dir);
  // Turn the per_key scenario's checkpoint into an fp32-policy save with a bf16 override, listed
  // before the real fp32 save of that config: it must not be taken as the reference.
  std::string csv = report_fixture::summary_csv();
  const std::string from = "1800,18,100,per_key,", to = "1800,18,100,fp32,";
  csv.replace(csv.find(from), from.size(), to);
  report_fixture::write(dir / "summary.csv", csv);
  const auto run = load_run(dir.string());
  const auto refs = fp32_references(run);
  EXPECT_EQ(refs[2], 1);   // not itself (2): its disk.csv has BF16 moments
  EXPECT_EQ(refs[0], 0);
  EXPECT_EQ(refs[4], -1);   // errored, no config
  fs::remove_all(dir);
}

}   // namespace
