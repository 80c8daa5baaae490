// Metrics CSV writer and fast-cpp-csv-parser reader; see metrics.h.
#include "harness/train/metrics.h"

#include "harness/base/text.h"

// fast-cpp-csv-parser's error type copies file names with strncpy; GCC warns inside the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-truncation"
#include <libfccp/csv.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace rh {

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> names = {"lm_loss", "aux_loss", "total_loss", "grad_norm", "lr", "num_zeros"};
  return names;
}

double metric_value(const IterMetrics& m, const std::string& name) {
  if (name == "lm_loss") return m.lm_loss;
  if (name == "aux_loss") return m.aux_loss;
  if (name == "total_loss") return m.total_loss;
  if (name == "grad_norm") return m.grad_norm;
  if (name == "lr") return m.lr;
  if (name == "num_zeros") return static_cast<double>(m.num_zeros);
  throw std::invalid_argument("unknown metric '" + name + "'");
}

std::string exact_decimal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string hex_float(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

namespace {
std::string g9(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}
void write_file(const std::string& path, const std::string& body) { write_text(path, body); }   // O_NOFOLLOW
double parse_hex(const std::string& s, const std::string& path, unsigned line, const char* col) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == nullptr || *end != '\0')
    throw std::runtime_error(path + ":" + std::to_string(line) + ": column " + col + ": expected a hex float, got '" +
                             s + "'");
  return v;
}
}   // namespace

void write_metrics_csv(const std::string& path, const std::vector<IterMetrics>& rows) {
  std::string out =
      "iteration,consumed_samples,lm_loss,lm_loss_hex,aux_loss,aux_loss_hex,total_loss,"
      "total_loss_hex,grad_norm,grad_norm_hex,lr,lr_hex,num_zeros\n";
  for (const auto& m : rows) {
    out += std::to_string(m.iteration) + "," + std::to_string(m.consumed_samples) + "," + g9(m.lm_loss) + "," +
           hex_float(m.lm_loss) + "," + g9(m.aux_loss) + "," + hex_float(m.aux_loss) + "," + g9(m.total_loss) + "," +
           hex_float(m.total_loss) + "," + exact_decimal(m.grad_norm) + "," + hex_float(m.grad_norm) + "," +
           exact_decimal(m.lr) + "," + hex_float(m.lr) + "," + std::to_string(m.num_zeros) + "\n";
  }
  write_file(path, out);
}

void write_timing_csv(const std::string& path, const std::vector<IterMetrics>& rows) {
  std::string out = "iteration,seconds,tokens_per_s\n";
  for (const auto& m : rows)
    out += std::to_string(m.iteration) + "," + exact_decimal(m.seconds) + "," + exact_decimal(m.tokens_per_s) + "\n";
  write_file(path, out);
}

std::vector<IterMetrics> read_metrics_csv(const std::string& path) {
  std::vector<IterMetrics> rows;
  try {
    io::CSVReader<13> in(path);
    in.read_header(io::ignore_extra_column, "iteration", "consumed_samples", "lm_loss", "lm_loss_hex", "aux_loss",
                   "aux_loss_hex", "total_loss", "total_loss_hex", "grad_norm", "grad_norm_hex", "lr", "lr_hex",
                   "num_zeros");
    int64_t it, consumed, zeros;
    std::string a, ah, b, bh, c, ch, d, dh, e, eh;
    while (in.read_row(it, consumed, a, ah, b, bh, c, ch, d, dh, e, eh, zeros)) {
      const unsigned line = in.get_file_line();
      IterMetrics m;
      m.iteration = it;
      m.consumed_samples = consumed;
      m.lm_loss = static_cast<float>(parse_hex(ah, path, line, "lm_loss_hex"));
      m.aux_loss = static_cast<float>(parse_hex(bh, path, line, "aux_loss_hex"));
      m.total_loss = static_cast<float>(parse_hex(ch, path, line, "total_loss_hex"));
      m.grad_norm = parse_hex(dh, path, line, "grad_norm_hex");
      m.lr = parse_hex(eh, path, line, "lr_hex");
      m.num_zeros = zeros;
      rows.push_back(m);
    }
  } catch (const io::error::base& e) {
    throw std::runtime_error(std::string("malformed metrics CSV: ") + e.what());
  }
  return rows;
}

}   // namespace rh
