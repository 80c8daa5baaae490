// Scenario names and messages are read from files and end up in report.md and the
// `report --compare` output (both posted as pull-request comments) and in report.html. Each hostile
// payload below goes through every one of the three outputs; the test asserts that the raw payload
// (or the fragment of it that would act as markup there) never appears, that its escaped text
// does, and that every Markdown table row still has its header's number of cells.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "report_fixture.h"
#include "reports/compare_runs.h"
#include "reports/report_writer.h"
#include "reports/tables.h"

namespace {

namespace fs = std::filesystem;
using report_fixture::slurp;
using report_fixture::write;

enum class Output { markdown, html, compare };

const char* output_name(Output o) {
  switch (o) {
    case Output::markdown: return "report_md";
    case Output::html: return "report_html";
    case Output::compare: return "compare";
  }
  return "?";
}

struct Hostile {
  const char* name;                           // test name
  std::string payload;                        // put into scenario names and messages (and summary.json strings)
  bool in_csv;                                // summary.csv can carry it (a CSV line cannot hold a newline)
  std::string forbidden_md, escaped_md;       // in report.md and the compare output
  std::string forbidden_html, escaped_html;   // in report.html ("" forbidden: harmless there)
};

const Hostile kHostile[] = {
    {"script", "<script>alert(1)</script>", true, "<script", "&lt;script&gt;alert(1)&lt;/script&gt;", "<script",
     "&lt;script&gt;alert(1)&lt;/script&gt;"},
    {"img_onerror", "<img src=x onerror=alert(1)>", true, "<img src=x", "&lt;img src=x onerror=alert(1)&gt;",
     "<img src=x", "&lt;img src=x onerror=alert(1)&gt;"},
    {"table_pipe", "p|q", true, "p|q", "p\\|q", "", "p|q"},
    {"backticks", "x`y``z", true, "x`y", "x\\`y\\`\\`z", "", "x`y``z"},
    {"markdown_image", "![t](https://evil.example/t.png)", true, "![t]", "!\\[t\\](https://evil.example/t.png)", "",
     "![t](https://evil.example/t.png)"},
    {"entity", "&lt;b&gt;", true, "&lt;b&gt;", "&amp;lt;b&amp;gt;", "&lt;b&gt;", "&amp;lt;b&amp;gt;"},
    {"newline_block", "n\n## injected\n| a | b |", false, "\n## injected", "n ## injected \\| a \\| b \\|", "",
     "## injected"},
};

// gtest prints a parameter that fails; the name says which one.
void PrintTo(const Hostile& h, std::ostream* os) { *os << h.name; }
void PrintTo(Output o, std::ostream* os) { *os << output_name(o); }

// The number of cell separators in a Markdown table line: '|' not escaped by a backslash.
size_t separators(const std::string& line) {
  size_t n = 0;
  bool escaped = false;
  for (const char c : line) {
    if (c == '|' && !escaped) ++n;
    escaped = c == '\\' && !escaped;
  }
  return n;
}

// Every table (consecutive lines starting with '|') has one cell count in every row.
std::string broken_table_row(const std::string& md) {
  std::istringstream in(md);
  std::string line;
  size_t cells = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '|') {
      cells = 0;
      continue;
    }
    if (cells == 0) cells = separators(line);
    else if (separators(line) != cells) return line;
  }
  return "";
}

std::string csv_quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

// The fixture run with the payload in a scenario name, its verdict and first divergence, the
// matrix file and an environment value.
void write_hostile_run(const fs::path& root, const std::string& p, bool in_csv, bool passed) {
  report_fixture::write_run(root);
  const std::string name = in_csv ? "faults/skip=" + p : "faults/skip=exp_avg";
  const std::string msg = in_csv ? p : "message";
  std::string csv = report_fixture::summary_csv();
  const size_t at = csv.find("faults/skip=exp_avg,");
  csv.replace(at, csv.find('\n', at) - at,
              csv_quoted(name) + ",exact," + (passed ? "1,identical,PASS: " : "0,diverged,FAIL: ") + csv_quoted(msg) +
                  "," + csv_quoted((passed ? "first " : "then ") + msg) + ",0.0078125,0,0,,3,0,," +
                  (passed ? "1800" : "1900") + ",18,100,native,skip_exp_avg,bf16,bf16,fp32,2");
  // A scenario that errored: its message goes into the notes and the failing list.
  const size_t crash = csv.find("faults/crash,");
  csv.replace(crash, csv.find('\n', crash) - crash,
              "faults/crash,exact,0,error," + csv_quoted("FAIL: error: " + msg) + "," + csv_quoted(msg) +
                  ",0,,,,,,,0,0,0,native,none,bf16,bf16,fp32,0.5");
  write(root / "summary.csv", csv);
  // summary.json as JSON writes it: the payload as a JSON string (nlohmann escapes it).
  std::string js = report_fixture::summary_json();
  auto json_str = [](const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\', o += c;
      else if (c == '\n') o += "\\n";
      else o += c;
    }
    return o + "\"";
  };
  js.replace(js.find("\"faults/skip=exp_avg\""), std::string("\"faults/skip=exp_avg\"").size(), json_str(name));
  js.replace(js.find("\"scenarios/fixture.toml\""), std::string("\"scenarios/fixture.toml\"").size(),
             json_str("scenarios/" + p + ".toml"));
  js.replace(js.find("\"cpu\""), 5, json_str("cpu " + p));
  write(root / "summary.json", js);
}

class HostileText : public ::testing::TestWithParam<std::tuple<Hostile, Output>> {};

TEST_P(HostileText, IsEscapedInEveryOutput) {
  const auto& [h, output] = GetParam();
  setenv("RH_PLOTS_SCRIPT", "/nonexistent/plots.py", 1);   // the text is what is tested, not the plots
  const fs::path a = report_fixture::temp_dir(std::string("esc_a_") + h.name);
  const fs::path b = report_fixture::temp_dir(std::string("esc_b_") + h.name);
  write_hostile_run(a, h.payload, h.in_csv, true);
  write_hostile_run(b, h.payload, h.in_csv, false);
  // B also gains a scenario named after the payload (the "Only in B" list).
  if (h.in_csv) {
    std::string csv = slurp(b / "summary.csv");
    csv += csv_quoted("added/" + h.payload) +
           ",exact,1,identical,PASS: bit-exact resume,,0,0,0,,0,0,,1800,18,100,"
           "native,none,bf16,bf16,fp32,1\n";
    write(b / "summary.csv", csv);
  }
  std::string text;
  if (output == Output::compare) {
    std::ostringstream out;
    EXPECT_EQ(rh::report::compare_runs(a.string(), b.string(), out), 1);
    text = out.str();
  } else {
    std::ostringstream log;
    const auto files = rh::report::generate_report(b.string(), "", log);
    text = slurp(output == Output::markdown ? files.markdown : files.html);
  }
  const bool md = output != Output::html;
  const std::string& forbidden = md ? h.forbidden_md : h.forbidden_html;
  const std::string& escaped = md ? h.escaped_md : h.escaped_html;
  if (!forbidden.empty()) {
    EXPECT_EQ(text.find(forbidden), std::string::npos) << "raw '" << forbidden << "' in:\n" << text;
  }
  // compare prints only names and messages, summary.json's strings never reach it.
  if (h.in_csv || output != Output::compare) {
    EXPECT_NE(text.find(escaped), std::string::npos) << escaped << " not in:\n" << text;
  }
  if (md) {
    EXPECT_EQ(broken_table_row(text), "") << text;
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

INSTANTIATE_TEST_SUITE_P(Payloads, HostileText,
                         ::testing::Combine(::testing::ValuesIn(kHostile),
                                            ::testing::Values(Output::markdown, Output::html, Output::compare)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  output_name(std::get<1>(info.param));
                         });

// A code span holds any text literally when its fence is longer than every backtick run in it.
TEST(MarkdownCode, FenceOutgrowsTheTextsBackticks) {
  using rh::report::md_code;
  EXPECT_EQ(md_code("/runs/a"), "`/runs/a`");
  EXPECT_EQ(md_code("a`b"), "``a`b``");
  EXPECT_EQ(md_code("a``b`"), "``` a``b` ```");
  EXPECT_EQ(md_code("a\nb"), "`a b`");
}

}   // namespace
