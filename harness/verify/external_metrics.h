// What an external trainer logs, read back: per-iteration rows of (metric name, printed text),
// from its stdout through a regular expression with named groups (RE2: linear time, no
// recursion, so hostile output cannot crash it; the program size and the matching time are
// capped, so it cannot hang it either), or from a CSV / JSON-lines file. Rows are keyed by the
// iteration number the trainer prints, whatever its base. Files are streamed line by line: memory
// is one line (at most kMaxMetricLineBytes) plus the rows kept. LibTorch-free.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rh {

struct MetricRow {
  int64_t iteration = 0;
  std::vector<std::pair<std::string, std::string>> values;   // metric -> exact text, in log order
  size_t line = 0;                                           // 1-based line of the log or file
};

// An iteration one log printed more than once (a resumed run repeating a finished step, a trainer
// that logs train and eval rows under one number): every row is kept in MetricLog::rows.
struct RepeatedIteration {
  int64_t iteration = 0;
  size_t first_line = 0;   // the line of its first row
  size_t line = 0;         // the line of this later row
};

struct MetricLog {
  std::vector<MetricRow> rows;   // in log order, every row (a resumed run may repeat an iteration)
  // Per metric: the coarsest resolution any row printed it with ("" when every value is exact:
  // hex floats, 17 significant digits, JSON numbers, or text that is not a number).
  std::map<std::string, std::string> resolution;
  // Each row whose iteration an earlier row of this log already had, in log order. The
  // comparison decides what a repeat means; the reader only records it.
  std::vector<RepeatedIteration> repeated;

  // Appends a row, keeping the index find() uses and `repeated`. (Rows pushed onto `rows`
  // directly are found too, by a scan.)
  void append(MetricRow row);
  // First row of an iteration, or nullptr.
  const MetricRow* find(int64_t iteration) const;
  // The occurrence-th row (0 = the first) of an iteration, or nullptr.
  const MetricRow* find(int64_t iteration, size_t occurrence) const;
  // How many rows an iteration has.
  size_t count(int64_t iteration) const;

 private:
  std::unordered_map<int64_t, size_t> first_;                // iteration -> its first row
  std::unordered_map<int64_t, std::vector<size_t>> later_;   // repeated iteration -> its later rows
  size_t indexed_ = 0;                                       // rows the index covers
  bool index_current() const { return indexed_ == rows.size(); }
};

constexpr size_t kMaxMetricLineBytes = 1 << 16;   // longer stdout lines are not matched; longer file lines refused
constexpr size_t kMaxMetricRows = 1 << 20;
// RE2's cost is (bytes matched) x (program size) when its DFA gives up: a regex compiling to more
// instructions than this (RE2::ProgramSize) is refused. A log line's regex needs 20-200.
constexpr int kMaxMetricRegexProgramSize = 2000;
// Even a small program can make RE2's DFA give up on every byte (`a[ab]{20}` over random a/b text:
// ~1 MiB per 7 s), so matching one run's stdout may also take at most this much CPU time
// (checked every 64 lines or 4 KiB; one line costs well under a second).
constexpr double kMaxMetricMatchSeconds = 60;

// stdout_regex: Python-style (?P<name>...) groups; `iteration` is required. Every captured metric
// must be a number (decimal, exponent, hex float, nan, inf; as strtod reads it, whole). Throws
// std::invalid_argument naming `what` (the log) and the line for a malformed iteration number or a
// captured text that is not a number, and for a regex over the program size or time limit.
MetricLog parse_stdout_metrics(const std::string& text, const std::string& regex, const std::string& what,
                               double max_seconds = kMaxMetricMatchSeconds);
// CSV with a header row holding an `iteration` column (each column named once), or JSON lines
// with an "iteration" field (each key once); every other column / number, string, boolean or null
// field is a metric, compared as its text. JSON's non-standard NaN, Infinity and -Infinity (what
// Python's json.dumps writes) read as "nan", "inf", "-inf". Throws std::invalid_argument.
MetricLog parse_metrics_file(const std::string& text, const std::string& format, const std::string& what);

// The same, streamed from a regular file (a FIFO or device is refused; with no_follow a symbolic
// link too) of at most max_bytes, never read whole. Messages name the path. Every problem with the
// file itself (missing, wrong type, too big) is std::invalid_argument as well.
MetricLog read_stdout_metrics(const std::string& path, uint64_t max_bytes, const std::string& regex,
                              double max_seconds = kMaxMetricMatchSeconds);
MetricLog read_metrics_file(const std::string& path, uint64_t max_bytes, const std::string& format,
                            bool no_follow = true);

// Checks that a regex compiles, is within kMaxMetricRegexProgramSize and has an `iteration` group
// and one other; "" or the problem.
std::string regex_problem(const std::string& regex);

// Whether text is one number as strtod reads it, whole (no surrounding space, no trailing comma).
bool is_metric_number(const std::string& text);
// The value of a printed number (strtod; NaN when it is not one).
double metric_number(const std::string& text);
// How finely a printed number resolves its value: "" if exactly (hex float, >= 17 significant
// digits, an integer, nan/inf) or not a number, else e.g. "6 decimals: a difference below 5e-07
// cannot be seen".
std::string printed_resolution(const std::string& text);

}   // namespace rh
