// Internal to the metric readers (external_metrics.cpp: the log, the stdout regex, printed
// numbers; metric_files.cpp: CSV and JSON lines): cutting a stream into bounded lines, and the
// helpers both use. Not for other rooms: use external_metrics.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "harness/verify/external_metrics.h"

namespace rh::metrics_detail {

// Cuts a stream, fed in blocks, into lines (without their "\n" or "\r\n") and hands each to a
// reader with its 1-based number. A line longer than kMaxMetricLineBytes is never held: the reader
// gets its first kMaxMetricLineBytes + 1 bytes and overlong = true.
class LineReader {
 public:
  virtual ~LineReader() = default;
  virtual void line(std::string_view text, size_t number, bool overlong) = 0;

  void feed(const char* p, size_t n);
  void finish();

 private:
  void end_line();

  std::string buf_;
  bool overlong_ = false;
  size_t number_ = 0;
};

// The whole text, then its end.
void feed_text(LineReader& reader, const std::string& text);
// A regular file (a FIFO or device refused; with no_follow a link too) of at most max_bytes,
// streamed in 64 KiB blocks; every problem with the file is std::invalid_argument naming it.
void feed_file(LineReader& reader, const std::string& path, uint64_t max_bytes, bool no_follow);

// A non-negative decimal integer of at most 18 digits.
bool parse_iteration(std::string_view s, int64_t* out);
// Appends a row (at most kMaxMetricRows), keeping each metric's coarsest printed resolution.
void add_row(MetricLog& log, MetricRow row, const std::string& what);
// "what:line".
std::string where_of(const std::string& what, size_t line);

}   // namespace rh::metrics_detail
