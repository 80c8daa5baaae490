// Reading an external trainer's logged metrics; see external_metrics.h.
#include "harness/verify/external_metrics.h"

#include <re2/re2.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "harness/base/input.h"

#include "harness/verify/metric_lines.h"

namespace rh {
namespace {

// The coarser of two resolution texts (fewer digits wins); "" is exact.
int digits_of(const std::string& res) { return res.empty() ? 99 : std::atoi(res.c_str()); }

}   // namespace

namespace metrics_detail {

bool parse_iteration(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

void add_row(MetricLog& log, MetricRow row, const std::string& what) {
  if (log.rows.size() >= kMaxMetricRows)
    throw std::invalid_argument(what + ": more than " + std::to_string(kMaxMetricRows) + " metric rows");
  for (const auto& [name, text] : row.values) {
    const std::string r = printed_resolution(text);
    auto it = log.resolution.find(name);
    if (it == log.resolution.end() || digits_of(r) < digits_of(it->second)) log.resolution[name] = r;
  }
  log.append(std::move(row));
}

std::string where_of(const std::string& what, size_t line) { return what + ":" + std::to_string(line); }

void LineReader::feed(const char* p, size_t n) {
  while (n > 0) {
    const void* nl = std::memchr(p, '\n', n);
    const size_t take = nl ? static_cast<size_t>(static_cast<const char*>(nl) - p) : n;
    if (!overlong_) {
      const size_t room = kMaxMetricLineBytes + 1 - buf_.size();
      buf_.append(p, std::min(take, room));
      if (take > room) overlong_ = true;
    }
    if (!nl) return;
    end_line();
    p += take + 1;
    n -= take + 1;
  }
}

void LineReader::finish() {
  if (!buf_.empty() || overlong_) end_line();
}

void LineReader::end_line() {
  ++number_;
  std::string_view text(buf_);
  if (!overlong_ && !text.empty() && text.back() == '\r') text.remove_suffix(1);
  line(text, number_, overlong_ || text.size() > kMaxMetricLineBytes);
  buf_.clear();
  overlong_ = false;
}

void feed_text(LineReader& reader, const std::string& text) {
  reader.feed(text.data(), text.size());
  reader.finish();
}

// Streams a regular file into the reader in 64 KiB blocks.
void feed_file(LineReader& reader, const std::string& path, uint64_t max_bytes, bool no_follow) {
  uint64_t size = 0;
  int fd = -1;
  try {
    fd = open_regular_file(path, &size, no_follow);
  } catch (const InputError& e) {
    throw std::invalid_argument(e.what());
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  auto too_big = [&](const std::string& got) {
    throw std::invalid_argument(path + ": " + got + ", more than the " + std::to_string(max_bytes) +
                                "-byte limit for this file");
  };
  if (size > max_bytes) too_big(std::to_string(size) + " bytes");
  std::vector<char> buf(1 << 16);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::invalid_argument(path + ": cannot read: " + std::strerror(errno));
    }
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
    if (total > max_bytes) too_big("more bytes than its size said");
    reader.feed(buf.data(), static_cast<size_t>(n));
  }
  reader.finish();
}

}   // namespace metrics_detail

namespace {

using metrics_detail::add_row;
using metrics_detail::LineReader;
using metrics_detail::parse_iteration;
using metrics_detail::where_of;

// RE2 spells named groups (?P<name>...); Python 3.11 and PCRE also accept (?<name>...).
std::string to_re2(const std::string& re) {
  std::string out;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '\\' && i + 1 < re.size()) {
      out += re.substr(i, 2);
      ++i;
      continue;
    }
    if (re.compare(i, 3, "(?<") == 0 && i + 3 < re.size() && re[i + 3] != '=' && re[i + 3] != '!') {
      out += "(?P<";
      i += 2;
      continue;
    }
    out += re[i];
  }
  return out;
}

// The compiled regex, or the problem with it ("" when none).
std::unique_ptr<RE2> compile(const std::string& regex, std::string* problem) {
  RE2::Options opt;
  opt.set_log_errors(false);
  auto re = std::make_unique<RE2>(to_re2(regex), opt);
  if (!re->ok()) {
    *problem = "does not compile: " + re->error();
  } else if (re->ProgramSize() > kMaxMetricRegexProgramSize) {
    *problem = "compiles to " + std::to_string(re->ProgramSize()) + " RE2 instructions, more than the limit of " +
               std::to_string(kMaxMetricRegexProgramSize) +
               " (matching costs bytes x instructions; large counted repeats such as {1000} multiply it)";
  } else {
    const auto& names = re->NamedCapturingGroups();
    if (!names.count("iteration")) *problem = "has no (?P<iteration>...) group";
    else if (names.size() < 2) *problem = "has no metric group besides (?P<iteration>...)";
  }
  return re;
}


// This thread's CPU time: the matching limit holds on a loaded machine as on a quiet one.
double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

class RegexReader : public LineReader {
 public:
  RegexReader(const std::string& regex, std::string what, double max_seconds)
      : what_(std::move(what)), max_seconds_(max_seconds), start_(cpu_seconds()) {
    std::string problem;
    re_ = compile(regex, &problem);
    if (!problem.empty()) throw std::invalid_argument("trainer.metrics.stdout_regex: " + problem);
    groups_ = re_->NumberOfCapturingGroups();
    names_.assign(static_cast<size_t>(groups_) + 1, nullptr);
    for (const auto& [index, name] : re_->CapturingGroupNames()) names_[static_cast<size_t>(index)] = &name;
    m_.resize(static_cast<size_t>(groups_) + 1);
    matches_empty_ = RE2::PartialMatch("", *re_);
  }

  void line(std::string_view text, size_t number, bool overlong) override {
    if (overlong) return;   // not matched (documented)
    if (text.empty() && !matches_empty_) return;
    bytes_since_check_ += text.size() + 1;
    if (++lines_since_check_ >= 64 || bytes_since_check_ >= 4096) check_time(number);
    if (!re_->Match(re2::StringPiece(text.data(), text.size()), 0, text.size(), RE2::UNANCHORED, m_.data(),
                    groups_ + 1))
      return;
    MetricRow row;
    row.line = number;
    bool have_iter = false;
    for (int g = 1; g <= groups_; ++g) {
      const std::string* name = names_[static_cast<size_t>(g)];
      const auto& piece = m_[static_cast<size_t>(g)];
      if (!name || piece.data() == nullptr) continue;
      std::string v(piece.data(), piece.size());
      if (*name == "iteration") {
        if (!parse_iteration(v, &row.iteration))
          throw std::invalid_argument(where_of(what_, number) + ": iteration '" + quote_text(v, 40) +
                                      "' is not a non-negative integer");
        have_iter = true;
      } else {
        if (!is_metric_number(v))
          throw std::invalid_argument(where_of(what_, number) + ": metric " + *name + " captured '" +
                                      quote_text(v, 40) +
                                      "', which is not a number (trainer.metrics.stdout_regex: capture only the "
                                      "number, e.g. (?P<" + *name + ">[-+.\\w]+))");
        row.values.emplace_back(*name, std::move(v));
      }
    }
    if (have_iter) add_row(log, std::move(row), what_);
  }

  void check_time(size_t number) {
    lines_since_check_ = bytes_since_check_ = 0;
    const double s = cpu_seconds() - start_;
    if (s >= max_seconds_) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", max_seconds_);
      throw std::invalid_argument(where_of(what_, number) + ": matching trainer.metrics.stdout_regex took more than " +
                                  limit + " CPU seconds (the limit) before this line; RE2's cost is bytes x program size (" +
                                  std::to_string(re_->ProgramSize()) + " instructions): simplify the regex");
    }
  }

  MetricLog log;

 private:
  std::string what_;
  double max_seconds_;
  double start_;   // cpu_seconds() when matching began
  bool matches_empty_ = false;
  std::unique_ptr<RE2> re_;
  int groups_ = 0;
  std::vector<const std::string*> names_;   // by group index; nullptr for an unnamed group
  std::vector<re2::StringPiece> m_;
  size_t lines_since_check_ = 0, bytes_since_check_ = 0;
};

}   // namespace

void MetricLog::append(MetricRow row) {
  if (!index_current()) {   // rows were pushed directly: index them first
    first_.clear();
    later_.clear();
    repeated.clear();
    std::vector<MetricRow> old;
    old.swap(rows);
    indexed_ = 0;
    for (auto& r : old) append(std::move(r));
  }
  const size_t at = rows.size();
  auto [it, fresh] = first_.emplace(row.iteration, at);
  if (!fresh) {
    later_[row.iteration].push_back(at);
    repeated.push_back({row.iteration, rows[it->second].line, row.line});
  }
  rows.push_back(std::move(row));
  indexed_ = rows.size();
}

const MetricRow* MetricLog::find(int64_t iteration) const { return find(iteration, 0); }

const MetricRow* MetricLog::find(int64_t iteration, size_t occurrence) const {
  if (!index_current()) {
    for (const auto& r : rows)
      if (r.iteration == iteration && occurrence-- == 0) return &r;
    return nullptr;
  }
  if (occurrence == 0) {
    auto it = first_.find(iteration);
    return it == first_.end() ? nullptr : &rows[it->second];
  }
  auto it = later_.find(iteration);
  if (it == later_.end() || occurrence > it->second.size()) return nullptr;
  return &rows[it->second[occurrence - 1]];
}

size_t MetricLog::count(int64_t iteration) const {
  if (!index_current()) {
    size_t n = 0;
    for (const auto& r : rows) n += r.iteration == iteration;
    return n;
  }
  if (!first_.count(iteration)) return 0;
  auto it = later_.find(iteration);
  return 1 + (it == later_.end() ? 0 : it->second.size());
}

std::string regex_problem(const std::string& regex) {
  std::string problem;
  compile(regex, &problem);
  return problem;
}

MetricLog parse_stdout_metrics(const std::string& text, const std::string& regex, const std::string& what,
                               double max_seconds) {
  RegexReader reader(regex, what, max_seconds);
  feed_text(reader, text);
  return std::move(reader.log);
}

MetricLog read_stdout_metrics(const std::string& path, uint64_t max_bytes, const std::string& regex,
                              double max_seconds) {
  RegexReader reader(regex, path, max_seconds);
  feed_file(reader, path, max_bytes, false);
  return std::move(reader.log);
}

bool is_metric_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  const char* b = text.c_str();
  char* end = nullptr;
  std::strtod(b, &end);
  return end == b + text.size();
}

double metric_number(const std::string& text) {
  const char* b = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(b, &end);
  while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == b || (end && *end)) return std::numeric_limits<double>::quiet_NaN();
  return v;
}

std::string printed_resolution(const std::string& text) {
  if (!is_metric_number(text)) return "";   // text (a CSV note, a JSON boolean) is compared as text
  const size_t b = (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (text.compare(b, 2, "0x") == 0 || text.compare(b, 2, "0X") == 0) return "";   // hex float
  if (!std::isdigit(static_cast<unsigned char>(text[b])) && text[b] != '.') return "";   // nan, inf
  const size_t e = text.find_first_of("eE");
  const std::string mant = text.substr(0, e);
  const size_t dot = mant.find('.');
  if (dot == std::string::npos && e == std::string::npos) return "";   // an integer
  int sig = 0, digits = 0;
  bool leading = true;
  for (char c : mant) {
    if (!std::isdigit(static_cast<unsigned char>(c))) continue;
    ++digits;
    if (leading && c == '0') continue;
    leading = false;
    ++sig;
  }
  if (sig >= 17) return "";
  char buf[160];
  if (e == std::string::npos) {
    const int decimals = static_cast<int>(mant.size() - dot - 1);
    std::snprintf(buf, sizeof buf, "%d decimals: a difference below %.0e cannot be seen", decimals,
                  0.5 * std::pow(10.0, -decimals));
  } else {
    if (sig == 0) sig = digits;   // 0.000e+00: every printed digit counts
    std::snprintf(buf, sizeof buf, "%d significant digits: a relative difference below %.0e cannot be seen", sig,
                  0.5 * std::pow(10.0, 1 - sig));
  }
  return buf;
}

}   // namespace rh
