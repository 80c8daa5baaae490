// What a matrix run directory holds, as the report reads it: summary.csv (one row per scenario),
// summary.json (environment, per-scenario config) and each scenario's CSVs. Only files are read,
// never the harness's in-memory state. Numbers are kept as the exact text the harness wrote next
// to their parsed value, so report.md, report.html and summary.csv show the very same digits.
// A missing per-scenario file is recorded (errored scenarios lack some); a file that exists and
// is malformed raises ReportError naming the file and line.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/base/text.h"   // write_text, csv_field
#include "harness/verify/outcome.h"

namespace rh::report {

// Raised for a run directory that cannot be reported on; the message starts with "file:line:"
// (or "file:" when no line applies) and says what was expected.
struct ReportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The state-key kinds with a max_ulp_<kind> column in summary.csv, in column order.
const std::vector<std::string>& ulp_kinds();
// Every kind disk.csv may list, in the order tables and plots show them.
const std::vector<std::string>& disk_kinds();

// A number as written in a CSV: `text` is shown, `value` is used for arithmetic.
struct Num {
  std::string text;
  double value = 0;
};

// One row of summary.csv.
struct SummaryRow {
  unsigned line = 0;   // line in summary.csv (1 = header)
  std::string scenario, expectation, verdict, first_divergence;
  Outcome outcome = Outcome::error;   // harness/verify/outcome.h: the verdict type the check wrote
  bool passed = false;
  Num max_abs_dloss;
  std::map<std::string, Num> max_ulp;   // kind -> value; kinds with an empty field are absent
  Num checkpoint_bytes, bytes_per_param, num_params;
  std::string save_policy, fault, exp_avg_dtype, exp_avg_sq_dtype, master_mode;
  Num seconds;
  // Optional columns (runs before compression had none): "none" / "zstd", and the bytes/param
  // the same checkpoint takes uncompressed.
  std::string compress = "none";
  Num raw_bytes_per_param;
  // An external trainer's cell (no built-in settings), its diagnosis code and explanation
  // (harness/verify/diagnosis.h; "" for built-in cells and runs before them).
  bool external = false;
  std::string diagnosis, explanation;
};

// One row of disk.csv (a tensor, a safetensors header, or the manifest).
struct DiskRow {
  std::string file, key, kind, dtype;   // kind: model | master_param | ... | metadata
  uint64_t numel = 0, bytes = 0;
};

// One row of state_compare.csv.
struct StateRow {
  std::string phase, key, kind, dtype_saved, dtype_loaded;   // phase: after_load | final | determinism | round_trip
  uint64_t numel = 0, max_ulp = 0;
  double bit_equal_fraction = 0, max_abs_diff = 0;
};

struct ScenarioData {
  SummaryRow row;
  std::string group;         // canonical name up to the first '/'
  std::string rel_dir;       // "scenarios/<safe name>", relative to the run dir
  nlohmann::json config;     // run config (null when neither json file has it)
  int64_t save_at = -1;      // K (-1 unknown)
  int64_t iterations = -1;   // N (-1 unknown)
  bool has_disk = false, has_state = false, has_metrics_compare = false;
  bool has_baseline = false, has_resumed = false;
  std::vector<DiskRow> disk;
  std::vector<StateRow> state;
  int64_t metric_rows = 0;            // rows of metrics_compare.csv
  std::vector<std::string> missing;   // files expected but absent, relative to rel_dir
};

struct RunData {
  std::string dir;
  std::vector<ScenarioData> scenarios;   // summary.csv order
  bool has_summary_json = false;
  nlohmann::json environment;   // summary.json "environment" (null when absent)
  std::string matrix_file;      // summary.json "file"
  std::string total_seconds;    // summary.json "seconds", as text
};

// The whole of one file the harness wrote, read as hostile input: a regular file only (a FIFO is
// refused instead of blocking), at most max_bytes (a link to /dev/zero cannot exhaust memory).
// Throws ReportError naming the path.
constexpr uint64_t kMaxRunFileBytes = 256ull << 20;
std::string read_run_file(const std::string& path, uint64_t max_bytes = kMaxRunFileBytes);

// Writes one output of the report (report.md, a CSV) whole; throws ReportError naming the path.
void write_report_file(const std::string& path, const std::string& text);

// Parses a number field; throws ReportError "path:line: column C: expected a number, got '..'".
Num parse_num(const std::string& text, const std::string& path, unsigned line, const std::string& column);

// Reads summary.csv only (compare mode needs nothing else). Throws ReportError.
std::vector<SummaryRow> read_summary_csv(const std::string& path);
std::vector<DiskRow> read_disk_csv(const std::string& path);
std::vector<StateRow> read_state_csv(const std::string& path);
// Validates metrics_compare.csv; returns its number of data rows.
int64_t check_metrics_compare_csv(const std::string& path);
// Validates a baseline/ or resumed/ metrics.csv (format: harness/train/metrics.h).
void check_metrics_csv(const std::string& path);

// Reads the whole run directory. Throws ReportError when summary.csv is missing or any present
// file is malformed.
RunData load_run(const std::string& dir);

}   // namespace rh::report
