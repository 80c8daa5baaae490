// Reading an external trainer's metrics file: CSV or JSON lines, streamed; see external_metrics.h.
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string_view>

#include "harness/base/input.h"
#include "harness/verify/external_metrics.h"
#include "harness/verify/metric_lines.h"

namespace rh {
namespace {

using metrics_detail::add_row;
using metrics_detail::LineReader;
using metrics_detail::parse_iteration;
using metrics_detail::where_of;

// One CSV record (RFC 4180 quoting; no newlines inside fields).
std::vector<std::string> csv_fields(std::string_view line, const std::string& where) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else out.back() += c;
    } else if (c == '"' && out.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  if (quoted) throw std::invalid_argument(where + ": unterminated quoted field");
  return out;
}

void refuse_overlong(const std::string& what, size_t number) {
  throw std::invalid_argument(where_of(what, number) + ": a line longer than " + std::to_string(kMaxMetricLineBytes) +
                              " bytes (the limit for one metrics row)");
}

class CsvReader : public LineReader {
 public:
  explicit CsvReader(std::string what) : what_(std::move(what)) {}

  void line(std::string_view text, size_t number, bool overlong) override {
    if (overlong) refuse_overlong(what_, number);
    const std::string where = where_of(what_, number);
    if (number == 1) {
      header_ = csv_fields(text, where);
      std::map<std::string, size_t> seen;
      for (size_t i = 0; i < header_.size(); ++i) {
        auto [it, fresh] = seen.emplace(header_[i], i);
        if (!fresh)
          throw std::invalid_argument(where + ": column '" + quote_text(header_[i], 40) + "' is named twice (columns " +
                                      std::to_string(it->second + 1) + " and " + std::to_string(i + 1) +
                                      "); each metric needs its own name");
        if (header_[i] == "iteration") iter_col_ = i;
      }
      if (iter_col_ == kNone) throw std::invalid_argument(where + ": no 'iteration' column in the header");
      return;
    }
    if (text.empty()) return;
    const auto f = csv_fields(text, where);
    if (f.size() != header_.size())
      throw std::invalid_argument(where + ": " + std::to_string(f.size()) + " fields, the header has " +
                                  std::to_string(header_.size()));
    MetricRow row;
    row.line = number;
    if (!parse_iteration(f[iter_col_], &row.iteration))
      throw std::invalid_argument(where + ": iteration '" + quote_text(f[iter_col_], 40) +
                                  "' is not a non-negative integer");
    for (size_t i = 0; i < f.size(); ++i)
      if (i != iter_col_) row.values.emplace_back(header_[i], f[i]);
    add_row(log, std::move(row), what_);
  }

  MetricLog log;

 private:
  std::string what_;
  std::vector<std::string> header_;
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t iter_col_ = kNone;
};

// Python's json.dumps writes NaN, Infinity and -Infinity, which JSON lacks. Outside strings, each
// such bare value becomes the string "\u0001rh:NaN" (etc.) before parsing; the reader turns it back
// into nan / inf / -inf. A line that itself holds the escape \u0001 is refused if it needs this.
const char kNonFiniteMark[] = "\x01rh:";

std::string mark_non_finite(std::string_view line, const std::string& where, bool* marked) {
  static const char* const kTokens[] = {"-Infinity", "Infinity", "NaN"};
  std::string out;
  out.reserve(line.size() + 16);
  bool in_string = false;
  char last = 0;   // the last character outside strings that is not a space
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < line.size()) out += line[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    const bool value_position = last != 0 && std::strchr(":[,", last) != nullptr;
    if (c != ' ' && c != '\t') last = c;
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool replaced = false;
    for (const char* token : kTokens) {
      const size_t n = std::strlen(token);
      if (!value_position || line.compare(i, n, token) != 0) continue;
      if (i + n < line.size() && !std::strchr(" \t\r,]}", line[i + n])) continue;
      out += "\"\\u0001rh:";
      out += token;
      out += '"';
      i += n - 1;
      replaced = *marked = true;
      break;
    }
    if (!replaced) out += c;
  }
  if (*marked && line.find("\\u0001") != std::string_view::npos)
    throw std::invalid_argument(where + ": a line with a bare NaN or Infinity must not also hold the escape \\u0001");
  return out;
}

class JsonlReader : public LineReader {
 public:
  explicit JsonlReader(std::string what) : what_(std::move(what)) {}

  void line(std::string_view text, size_t number, bool overlong) override {
    if (overlong) refuse_overlong(what_, number);
    if (text.find_first_not_of(" \t") == std::string_view::npos) return;
    const std::string where = where_of(what_, number);
    bool marked = false;
    std::string marked_text;
    if (text.find("NaN") != std::string_view::npos || text.find("Infinity") != std::string_view::npos)
      marked_text = mark_non_finite(text, where, &marked);
    const std::string_view json = marked ? std::string_view(marked_text) : text;
    const auto j = parse_json_unique(json.data(), json.size(), where);
    if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object per line");
    auto it = j.find("iteration");
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
      throw std::invalid_argument(where + ": expected a non-negative integer field \"iteration\"");
    MetricRow row;
    row.line = number;
    row.iteration = it->get<int64_t>();
    for (const auto& [k, v] : j.items()) {
      if (k == "iteration") continue;
      if (v.is_number_float()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());   // the parsed double, exactly
        row.values.emplace_back(k, buf);
      } else if (v.is_number() || v.is_boolean() || v.is_null()) {
        row.values.emplace_back(k, v.dump());
      } else if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        if (marked && s.rfind(kNonFiniteMark, 0) == 0) {
          const std::string token = s.substr(std::strlen(kNonFiniteMark));
          row.values.emplace_back(k, token == "NaN" ? "nan" : token == "Infinity" ? "inf" : "-inf");
        } else {
          row.values.emplace_back(k, s);
        }
      }   // arrays and objects are not metrics
    }
    add_row(log, std::move(row), what_);
  }

  MetricLog log;

 private:
  std::string what_;
};

MetricLog by_format(const std::string& format, const std::string& what,
                    const std::function<void(LineReader&)>& feed) {
  if (format == "csv") {
    CsvReader reader(what);
    feed(reader);
    return std::move(reader.log);
  }
  if (format != "jsonl") throw std::invalid_argument("metrics.format: expected csv or jsonl, got '" + format + "'");
  JsonlReader reader(what);
  feed(reader);
  return std::move(reader.log);
}

}   // namespace

MetricLog parse_metrics_file(const std::string& text, const std::string& format, const std::string& what) {
  return by_format(format, what, [&](LineReader& reader) { feed_text(reader, text); });
}

MetricLog read_metrics_file(const std::string& path, uint64_t max_bytes, const std::string& format, bool no_follow) {
  return by_format(format, path,
                         [&](LineReader& reader) { feed_file(reader, path, max_bytes, no_follow); });
}

}   // namespace rh
