// Reading an external trainer's logged metrics; see external_metrics.h.
#include "harness/verify/external_metrics.h"

#include <re2/re2.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "harness/base/input.h"

namespace rh {
namespace {

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

bool parse_iteration(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  *out = std::strtoll(s.c_str(), nullptr, 10);
  return true;
}

// The coarser of two resolution texts (fewer digits wins); "" is exact.
int digits_of(const std::string& res) { return res.empty() ? 99 : std::atoi(res.c_str()); }

void add_row(MetricLog& log, MetricRow row, const std::string& what) {
  if (log.rows.size() >= kMaxMetricRows)
    throw std::invalid_argument(what + ": more than " + std::to_string(kMaxMetricRows) + " metric rows");
  for (const auto& [name, text] : row.values) {
    const std::string r = printed_resolution(text);
    auto it = log.resolution.find(name);
    if (it == log.resolution.end() || digits_of(r) < digits_of(it->second)) log.resolution[name] = r;
  }
  log.rows.push_back(std::move(row));
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(b, e - b);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    b = e + 1;
  }
  return lines;
}

// One CSV record (RFC 4180 quoting; no newlines inside fields).
std::vector<std::string> csv_fields(const std::string& line, const std::string& where) {
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

}   // namespace

const MetricRow* MetricLog::find(int64_t iteration) const {
  for (const auto& r : rows)
    if (r.iteration == iteration) return &r;
  return nullptr;
}

std::string regex_problem(const std::string& regex) {
  RE2::Options opt;
  opt.set_log_errors(false);
  RE2 re(to_re2(regex), opt);
  if (!re.ok()) return "does not compile: " + re.error();
  const auto& names = re.NamedCapturingGroups();
  if (!names.count("iteration")) return "has no (?P<iteration>...) group";
  if (names.size() < 2) return "has no metric group besides (?P<iteration>...)";
  return "";
}

MetricLog parse_stdout_metrics(const std::string& text, const std::string& regex, const std::string& what) {
  RE2::Options opt;
  opt.set_log_errors(false);
  RE2 re(to_re2(regex), opt);
  if (!re.ok()) throw std::invalid_argument("metrics.stdout_regex does not compile: " + re.error());
  // Groups by index, in the order they open in the pattern (the metrics' order in a row).
  const auto& by_index = re.CapturingGroupNames();
  const int groups = re.NumberOfCapturingGroups();
  std::vector<re2::StringPiece> m(static_cast<size_t>(groups) + 1);
  MetricLog log;
  const auto lines = split_lines(text);
  for (size_t ln = 0; ln < lines.size(); ++ln) {
    const std::string& line = lines[ln];
    if (line.size() > kMaxMetricLineBytes) continue;
    if (!re.Match(line, 0, line.size(), RE2::UNANCHORED, m.data(), groups + 1)) continue;
    MetricRow row;
    row.line = ln + 1;
    bool have_iter = false;
    for (int g = 1; g <= groups; ++g) {
      auto it = by_index.find(g);
      if (it == by_index.end() || m[static_cast<size_t>(g)].data() == nullptr) continue;
      const std::string v(m[static_cast<size_t>(g)].data(), m[static_cast<size_t>(g)].size());
      if (it->second == "iteration") {
        if (!parse_iteration(v, &row.iteration))
          throw std::invalid_argument(what + ":" + std::to_string(ln + 1) + ": iteration '" + quote_text(v, 40) +
                                      "' is not a non-negative integer");
        have_iter = true;
      } else {
        row.values.emplace_back(it->second, v);
      }
    }
    if (have_iter) add_row(log, std::move(row), what);
  }
  return log;
}

MetricLog parse_metrics_file(const std::string& text, const std::string& format, const std::string& what) {
  MetricLog log;
  const auto lines = split_lines(text);
  if (format == "csv") {
    if (lines.empty()) return log;
    const auto header = csv_fields(lines[0], what + ":1");
    size_t iter_col = header.size();
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == "iteration") iter_col = i;
    if (iter_col == header.size()) throw std::invalid_argument(what + ":1: no 'iteration' column in the header");
    for (size_t ln = 1; ln < lines.size(); ++ln) {
      if (lines[ln].empty()) continue;
      const std::string where = what + ":" + std::to_string(ln + 1);
      const auto f = csv_fields(lines[ln], where);
      if (f.size() != header.size())
        throw std::invalid_argument(where + ": " + std::to_string(f.size()) + " fields, the header has " +
                                    std::to_string(header.size()));
      MetricRow row;
      row.line = ln + 1;
      if (!parse_iteration(f[iter_col], &row.iteration))
        throw std::invalid_argument(where + ": iteration '" + quote_text(f[iter_col], 40) +
                                    "' is not a non-negative integer");
      for (size_t i = 0; i < f.size(); ++i)
        if (i != iter_col) row.values.emplace_back(header[i], f[i]);
      add_row(log, std::move(row), what);
    }
    return log;
  }
  if (format != "jsonl") throw std::invalid_argument("metrics.format: expected csv or jsonl, got '" + format + "'");
  for (size_t ln = 0; ln < lines.size(); ++ln) {
    if (lines[ln].find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = what + ":" + std::to_string(ln + 1);
    const auto j = parse_json_bounded(lines[ln], where);
    if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object per line");
    auto it = j.find("iteration");
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
      throw std::invalid_argument(where + ": expected a non-negative integer field \"iteration\"");
    MetricRow row;
    row.line = ln + 1;
    row.iteration = it->get<int64_t>();
    for (const auto& [k, v] : j.items()) {
      if (k == "iteration") continue;
      if (v.is_number_float()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());   // the parsed double, exactly
        row.values.emplace_back(k, buf);
      } else if (v.is_number()) {
        row.values.emplace_back(k, v.dump());
      } else if (v.is_string()) {
        row.values.emplace_back(k, v.get<std::string>());
      }
    }
    add_row(log, std::move(row), what);
  }
  return log;
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
  if (text.find("0x") != std::string::npos || text.find("0X") != std::string::npos) return "";   // hex float
  const size_t e = text.find_first_of("eE");
  const std::string mant = text.substr(0, e);
  const size_t dot = mant.find('.');
  if (dot == std::string::npos && e == std::string::npos) return "";   // an integer
  int sig = 0;
  bool leading = true;
  for (char c : mant) {
    if (!std::isdigit(static_cast<unsigned char>(c))) continue;
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
    std::snprintf(buf, sizeof buf, "%d significant digits: a relative difference below %.0e cannot be seen", sig,
                  0.5 * std::pow(10.0, 1 - sig));
  }
  return buf;
}

}   // namespace rh
