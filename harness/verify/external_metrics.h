// What an external trainer logs, read back: per-iteration rows of (metric name, printed text),
// from its stdout through a regular expression with named groups (RE2: linear time, no
// recursion, so hostile output cannot hang or crash it), or from a CSV / JSON-lines file. Rows are
// keyed by the iteration number the trainer prints, whatever its base. LibTorch-free.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rh {

struct MetricRow {
  int64_t iteration = 0;
  std::vector<std::pair<std::string, std::string>> values;   // metric -> exact text, in log order
  size_t line = 0;                                           // 1-based line of the log or file
};

struct MetricLog {
  std::vector<MetricRow> rows;   // in log order (a resumed run may repeat an iteration)
  // Per metric: the coarsest resolution any row printed it with ("" when every value is exact:
  // hex floats, 17 significant digits or JSON numbers).
  std::map<std::string, std::string> resolution;
  // First row of an iteration, or nullptr.
  const MetricRow* find(int64_t iteration) const;
};

constexpr size_t kMaxMetricLineBytes = 1 << 16;   // longer log lines are not matched
constexpr size_t kMaxMetricRows = 1 << 20;

// stdout_regex: Python-style (?P<name>...) groups; `iteration` is required. Throws
// std::invalid_argument naming `what` (the log) and the line for a malformed iteration number.
MetricLog parse_stdout_metrics(const std::string& text, const std::string& regex, const std::string& what);
// CSV with a header row holding an `iteration` column, or JSON lines with an "iteration" field;
// every other column / numeric or string field is a metric. Throws std::invalid_argument.
MetricLog parse_metrics_file(const std::string& text, const std::string& format, const std::string& what);

// Checks that a regex compiles and has an `iteration` group and one other; "" or the problem.
std::string regex_problem(const std::string& regex);

// The value of a printed number (strtod; NaN when it is not one).
double metric_number(const std::string& text);
// How finely a printed number resolves its value: "" if exactly (hex float, >= 17 significant
// digits), else e.g. "6 decimals: a difference below 5e-07 cannot be seen".
std::string printed_resolution(const std::string& text);

}   // namespace rh
