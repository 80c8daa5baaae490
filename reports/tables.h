// The report's tables, built once from a RunData and printed by two printers (Markdown, HTML), so
// report.md and report.html cannot disagree. Also the two derived notions the tables need: the
// fp32-policy reference checkpoint of a scenario, and storage combinations (policy x the dtype
// each key kind was written in) measured from disk.csv.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/base/text.h"   // markup_escape, csv_field

#include "reports/run_data.h"

namespace rh::report {

struct Table {
  std::vector<std::string> header;
  std::vector<bool> right;   // right-aligned (numeric) columns
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row_class;   // HTML row class per row ("pass", "fail" or "")
  // Optional, per cell (same shape as rows when present): HTML class and hover text (title).
  std::vector<std::vector<std::string>> cell_class, cell_title;
  // Optional, per row: a path relative to report.html that the row's first cell links to in HTML
  // (a scenario's directory); "" for none. Markdown prints no link: it is posted where none resolves.
  std::vector<std::string> row_href;
  // HTML only: the table's class, and a column left out (-1: none), so a wide table fits the page
  // (its text can be another cell's cell_title).
  std::string html_class;
  int html_hidden_column = -1;
  // HTML only: this column's text is printed under the first cell's (small, grey), not as a
  // column of its own (-1: none): a long text that would wrap a narrow column over many lines.
  int html_subline_column = -1;
  // HTML only, optional, per row: the row's scenario group. A first cell starting with "GROUP/"
  // is shown without it (the table is that group's), with a line-break opportunity after each
  // comma, so a long name takes one or two lines instead of wrapping mid-word.
  std::vector<std::string> row_group;
  // HTML only: with a summary, the table is folded in <details> (open when html_fold_open), with
  // html_fold_id as the element's id (a link target, "report.html#group-states").
  std::string html_fold_summary, html_fold_id;
  bool html_fold_open = false;
};

// Tables print every cell escaped for their format: HTML by markup_escape, Markdown by md_cell.
std::string to_markdown(const Table& table);
std::string to_html(const Table& table);

// Text for GitHub Markdown (report.md and `report --compare` are posted as PR comments): scenario
// names and messages come from files and may hold markup. md_text keeps it one line of literal
// text: `<`, `>` and `&` as entities (no raw HTML, no autolink), a backslash before each of
// \ ` * [ ] | (no code span, emphasis, link or image, no table cell boundary), CR and LF as
// spaces (no new block). md_cell is the same for a table cell (" " when empty, as GFM needs).
std::string md_text(const std::string& s);
std::string md_cell(const std::string& s);
// s as one literal code span: a fence of one backtick more than the longest run of backticks in s
// (CommonMark), CR and LF as spaces; entities and escapes do not work inside code, fences do.
std::string md_code(const std::string& s);

// printf-style formatting of one double (e.g. fmt("%.2f", 28.571) -> "28.57").
std::string fmt(const char* format, double v);

// For each scenario, the index of the fp32-policy scenario with the same run config (a save
// policy and its overrides are not part of the config), or -1. Among candidates, one whose disk.csv
// shows every optimizer key in F32 (no override) and whose fault is "none" is preferred; a
// candidate without a checkpoint (0 bytes) is never taken.
std::vector<int> fp32_references(const RunData& run);

// Bytes per key kind of a scenario's disk.csv, every kind of disk_kinds() present (0 if none).
std::map<std::string, uint64_t> bytes_by_kind(const ScenarioData& scenario);

// A storage combination: the save policy and the dtype each key kind was written in, measured
// on the first scenario (in summary order) that wrote it and has an fp32 reference with a
// disk.csv (else the first that wrote it at all).
struct Combo {
  std::string label;   // "per_key: model BF16, master_param F32, ..."
  std::string policy;
  std::string compress = "none";               // "none" | "zstd": dtypes alike, bytes not
  std::map<std::string, std::string> dtypes;   // kind -> safetensors dtype (metadata excluded)
  // "per_key" or "per_key + zstd": the policy row a projection groups this configuration under.
  std::string policy_label() const { return compress == "none" ? policy : policy + " + " + compress; }
  size_t scenario = 0;                     // measured scenario (index in run.scenarios)
  int reference = -1;                      // its fp32 reference scenario, -1 none
  std::map<std::string, uint64_t> bytes;   // per kind, metadata included
  uint64_t total_bytes = 0;                // sum of disk.csv
  uint64_t payload_bytes = 0;              // total minus metadata (headers + manifest)
  uint64_t num_params = 0;
  double payload_per_param = 0;   // payload_bytes / num_params
  bool has_reduction = false;
  double reduction_pct = 0;           // total bytes vs the reference's total, in %
  double payload_reduction_pct = 0;   // payload per parameter vs the reference's, in %
};

std::vector<Combo> storage_combos(const RunData& run, const std::vector<int>& refs);

// A number for people: exact zero as "0", whole numbers (bytes, counts) and non-finite values as
// the harness wrote them, anything else to 4 significant digits (summary.csv keeps full precision).
std::string human(const Num& n);
// "28.57 %" for a size reduction; shared by every table that shows one.
std::string reduction_text(double pct);

Table matrix_table(const RunData& run, const std::vector<int>& refs);
Table disk_table(const RunData& run, const std::vector<Combo>& combos);
Table environment_table(const RunData& run);

// The verdict of a run in numbers, every scenario counted once: met = exact + tolerance + diverged
// + refused, and scenarios = met + failed. Only scenarios that met their expectation count as
// exact / tolerance / diverged / refused (a bit-exact resume that was declared to diverge failed).
struct StatusCounts {
  size_t scenarios = 0, met = 0;
  size_t exact = 0;       // identical, bit for bit
  size_t tolerance = 0;   // within its declared tolerance
  size_t diverged = 0;    // diverged as declared (a fault or lossy policy caught)
  size_t refused = 0;     // the checkpoint was refused, as declared
  size_t failed = 0;      // did not meet its expectation
  bool passed() const { return failed == 0; }
};
StatusCounts status_counts(const RunData& run);
// "PASSED: 5 scenarios, 5 met their expectation: 3 bit for bit, ...; 0 failed" (or FAILED).
std::string status_line(const StatusCounts& c);

// How a scenario ended, as a reader sorts it: "identical", "within tolerance", "diverged as
// expected" (a fault or lossy policy caught as declared), or "failed" (did not meet its
// expectation, whatever it found).
std::string outcome_class(const SummaryRow& r);
// The outcome grid of one scenario group: its canonical names "group/a=1,b=2,..." split into axes
// (a name part without '=' is its own value of an axis called "scenario"). The axes that every
// scenario of the group names are candidates for columns: the columns are the combinations of the
// candidate subset with the most combinations, at most kMaxGridColumns (ties: fewer axes, then the
// later ones), and never every axis; the other axes make the rows, so a grid stays narrow enough
// to read at 1280 px however many axes a group has. Rows and columns are in order of first
// appearance; each cell is the outcome_class of that scenario, with its verdict and first
// divergence as hover text ("—" where no scenario has that combination). A group of one scenario
// is one row that names it. A group whose grid would hold more than 16 cells per scenario (most
// of them empty) is a list instead, one row per scenario (its row value, its columns and its
// outcome), and `note` says so.
constexpr size_t kMaxGridColumns = 6;
struct OutcomeGrid {
  std::string group;
  Table table;
  std::string note;   // "" for a grid
};
std::vector<OutcomeGrid> outcome_grids(const RunData& run);

}   // namespace rh::report
