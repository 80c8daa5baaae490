// Golden metrics; see golden.h.
#include "harness/verify/golden.h"

#include <cstring>
#include <filesystem>

#include "harness/base/text.h"
#include "harness/train/metrics.h"

namespace fs = std::filesystem;

namespace rh {

std::string compare_golden(const std::string& golden_csv, const std::string& actual_csv) {
  const auto g = read_metrics_csv(golden_csv), a = read_metrics_csv(actual_csv);
  if (g.size() != a.size())
    return "golden has " + std::to_string(g.size()) + " rows, run has " + std::to_string(a.size());
  for (size_t i = 0; i < g.size(); ++i)
    for (const auto& name : metric_names()) {
      const double x = metric_value(g[i], name), y = metric_value(a[i], name);
      if (std::memcmp(&x, &y, sizeof x) != 0)
        return "iteration " + std::to_string(g[i].iteration) + ": " + name + " golden " + hex_float(x) + " vs run " +
               hex_float(y);
    }
  return "";
}

std::string golden_failure(const std::string& golden_csv, const std::string& actual_csv, bool update) {
  try {
    if (update) {
      fs::create_directories(fs::path(golden_csv).parent_path());
      copy_text_file(actual_csv, golden_csv);   // never through a link planted at golden_csv
      return "";
    }
    if (!fs::exists(golden_csv)) return "no golden metrics " + golden_csv + " (run with --update-golden)";
    const std::string diff = compare_golden(golden_csv, actual_csv);
    return diff.empty() ? "" : "baseline differs from golden " + golden_csv + ": " + diff;
  } catch (const std::exception& e) {
    return std::string("golden comparison: ") + e.what();
  }
}

}   // namespace rh
