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

double metric_value(const IterMetrics& metrics, const std::string& name) {
  if (name == "lm_loss") return metrics.lm_loss;
  if (name == "aux_loss") return metrics.aux_loss;
  if (name == "total_loss") return metrics.total_loss;
  if (name == "grad_norm") return metrics.grad_norm;
  if (name == "lr") return metrics.lr;
  if (name == "num_zeros") return static_cast<double>(metrics.num_zeros);
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
double parse_hex(const std::string& text, const std::string& path, unsigned line, const char* col) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0')
    throw std::runtime_error(path + ":" + std::to_string(line) + ": column " + col + ": expected a hex float, got '" +
                             text + "'");
  return value;
}
}   // namespace

void write_metrics_csv(const std::string& path, const std::vector<IterMetrics>& rows) {
  std::string out =
      "iteration,consumed_samples,lm_loss,lm_loss_hex,aux_loss,aux_loss_hex,total_loss,"
      "total_loss_hex,grad_norm,grad_norm_hex,lr,lr_hex,num_zeros\n";
  for (const auto& row : rows) {
    out += std::to_string(row.iteration) + "," + std::to_string(row.consumed_samples) + "," + g9(row.lm_loss) + "," +
           hex_float(row.lm_loss) + "," + g9(row.aux_loss) + "," + hex_float(row.aux_loss) + "," + g9(row.total_loss) +
           "," + hex_float(row.total_loss) + "," + exact_decimal(row.grad_norm) + "," + hex_float(row.grad_norm) + "," +
           exact_decimal(row.lr) + "," + hex_float(row.lr) + "," + std::to_string(row.num_zeros) + "\n";
  }
  write_file(path, out);
}

void write_timing_csv(const std::string& path, const std::vector<IterMetrics>& rows) {
  std::string out = "iteration,seconds,tokens_per_s\n";
  for (const auto& row : rows)
    out +=
        std::to_string(row.iteration) + "," + exact_decimal(row.seconds) + "," + exact_decimal(row.tokens_per_s) + "\n";
  write_file(path, out);
}

std::vector<IterMetrics> read_metrics_csv(const std::string& path) {
  std::vector<IterMetrics> rows;
  try {
    io::CSVReader<13> in(path);
    in.read_header(io::ignore_extra_column, "iteration", "consumed_samples", "lm_loss", "lm_loss_hex", "aux_loss",
                   "aux_loss_hex", "total_loss", "total_loss_hex", "grad_norm", "grad_norm_hex", "lr", "lr_hex",
                   "num_zeros");
    int64_t iteration, consumed_samples, num_zeros;
    std::string lm_loss, lm_loss_hex, aux_loss, aux_loss_hex, total_loss, total_loss_hex, grad_norm, grad_norm_hex, lr,
        lr_hex;
    while (in.read_row(iteration, consumed_samples, lm_loss, lm_loss_hex, aux_loss, aux_loss_hex, total_loss,
                       total_loss_hex, grad_norm, grad_norm_hex, lr, lr_hex, num_zeros)) {
      const unsigned line = in.get_file_line();
      IterMetrics metrics;
      metrics.iteration = iteration;
      metrics.consumed_samples = consumed_samples;
      metrics.lm_loss = static_cast<float>(parse_hex(lm_loss_hex, path, line, "lm_loss_hex"));
      metrics.aux_loss = static_cast<float>(parse_hex(aux_loss_hex, path, line, "aux_loss_hex"));
      metrics.total_loss = static_cast<float>(parse_hex(total_loss_hex, path, line, "total_loss_hex"));
      metrics.grad_norm = parse_hex(grad_norm_hex, path, line, "grad_norm_hex");
      metrics.lr = parse_hex(lr_hex, path, line, "lr_hex");
      metrics.num_zeros = num_zeros;
      rows.push_back(metrics);
    }
  } catch (const io::error::base& e) {
    throw std::runtime_error(std::string("malformed metrics CSV: ") + e.what());
  }
  return rows;
}

}   // namespace rh
