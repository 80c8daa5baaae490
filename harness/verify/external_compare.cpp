// The comparisons by what the runs logged; see external_compare.h.
#include "harness/verify/external_compare.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <stdexcept>
#include <system_error>

#include "harness/checkpoint/checked_io.h"

namespace fs = std::filesystem;

namespace rh::external {

namespace {

constexpr uint64_t kMaxProbeBytes = 256ull << 20;

std::vector<std::pair<std::string, std::string>> pairs_of(const nlohmann::json& j, const std::string& where,
                                                          const std::string& field) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!j.is_array()) throw std::invalid_argument(where + ": \"" + field + "\" must be an array of [name, text] pairs");
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
      throw std::invalid_argument(where + ": \"" + field + "\" must be an array of [name, text] pairs");
    out.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
  }
  return out;
}

}   // namespace

std::vector<ProbeRecord> read_probe(const fs::path& file) {
  std::vector<ProbeRecord> records;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return records;
  const std::string text = ckpt::read_regular_file(file.string(), kMaxProbeBytes, /*no_follow=*/true);
  size_t line_begin = 0, line = 0;
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = text.size();
    ++line;
    const std::string where = file.string() + ":" + std::to_string(line);
    if (line_end > line_begin) {
      const auto fields = ckpt::parse_json_bounded(text.data() + line_begin, line_end - line_begin, where);
      if (!fields.is_object()) throw std::invalid_argument(where + ": expected a JSON object");
      ProbeRecord record;
      auto event = fields.find("event"), it = fields.find("iteration");
      if (event == fields.end() || !event->is_string() ||
          (*event != "after_load" && *event != "step" && *event != "before_step"))
        throw std::invalid_argument(where + ": \"event\" must be \"after_load\", \"step\" or \"before_step\"");
      if (it == fields.end() || !it->is_number_integer())
        throw std::invalid_argument(where + ": \"iteration\" must be an integer");
      record.event = event->get<std::string>();
      record.iteration = it->get<int64_t>();
      if (auto m = fields.find("metrics"); m != fields.end()) record.metrics = pairs_of(*m, where, "metrics");
      if (auto st = fields.find("state"); st != fields.end()) record.state = pairs_of(*st, where, "state");
      records.push_back(std::move(record));
    }
    line_begin = line_end + 1;
  }
  return records;
}

const ProbeRecord* probe_step(const std::vector<ProbeRecord>& records, int64_t iteration) {
  for (const auto& record : records)
    if (record.event == "step" && record.iteration == iteration) return &record;
  return nullptr;
}

std::string first_differing(const std::vector<std::pair<std::string, std::string>>& ref,
                            const std::vector<std::pair<std::string, std::string>>& got,
                            const std::string& skip_prefix, const std::set<std::string>& skip_keys) {
  std::map<std::string, std::string> ref_values(ref.begin(), ref.end()), got_values(got.begin(), got.end());
  auto skipped = [&](const std::string& key) {
    return (!skip_prefix.empty() && key.rfind(skip_prefix, 0) == 0) || skip_keys.count(key) != 0;
  };
  for (const auto& [key, value] : got) {
    if (skipped(key)) continue;
    auto it = ref_values.find(key);
    if (it == ref_values.end()) return key + " (only in this run)";
    if (it->second != value) return key;
  }
  for (const auto& [key, value] : ref)
    if (!skipped(key) && !got_values.count(key)) return key + " (missing in this run)";
  return "";
}

std::set<std::string> unused_streams(const std::vector<const std::vector<ProbeRecord>*>& runs) {
  std::map<std::string, bool> constant;   // rng/<stream> -> constant within every run so far
  for (const auto* records : runs) {
    std::map<std::string, std::string> first;
    std::map<std::string, int> seen;
    for (const auto& record : *records)
      for (const auto& [key, value] : record.state) {
        if (key.rfind("rng/", 0) != 0) continue;
        auto [it, inserted] = first.emplace(key, value);
        ++seen[key];
        if (!inserted && it->second != value) constant[key] = false;
        else constant.emplace(key, true);
      }
    for (auto& [key, is_constant] : constant)
      if (seen[key] < 2) is_constant = false;   // one record shows no change, and no use either
  }
  std::set<std::string> out;
  for (const auto& [key, is_constant] : constant)
    if (is_constant) out.insert(key);
  return out;
}

Difference compare_rows(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                        std::vector<MetricDiff>* diffs) {
  std::map<int64_t, std::vector<std::string>> found;   // iteration -> what differs there, in log order
  std::map<std::string, int64_t> metric_first;         // metric -> its first differing iteration
  std::vector<std::string> metric_order;
  for (const auto& row : got.rows) {
    if (row.iteration < lo || row.iteration > hi) continue;
    const MetricRow* ref_row = ref.find(row.iteration);
    if (!ref_row) {
      found[row.iteration].push_back("not logged by the uninterrupted run");
      continue;
    }
    std::map<std::string, std::string> ref_values(ref_row->values.begin(), ref_row->values.end());
    for (const auto& [name, text] : row.values) {
      auto it = ref_values.find(name);
      if (it == ref_values.end()) {
        found[row.iteration].push_back("metric " + name + " only in the " + got_name + " run");
        continue;
      }
      MetricDiff metric_diff;
      metric_diff.iteration = row.iteration;
      metric_diff.metric = name;
      metric_diff.baseline = metric_number(it->second);
      metric_diff.resumed = metric_number(text);
      metric_diff.bit_equal = it->second == text;
      metric_diff.abs_diff = metric_diff.bit_equal ? 0 : std::fabs(metric_diff.baseline - metric_diff.resumed);
      if (std::isnan(metric_diff.abs_diff)) metric_diff.abs_diff = std::numeric_limits<double>::infinity();
      metric_diff.rel_diff = metric_diff.baseline != 0 ? metric_diff.abs_diff / std::fabs(metric_diff.baseline)
                                                       : (metric_diff.abs_diff == 0 ? 0 : INFINITY);
      metric_diff.ulp = metric_diff.bit_equal ? 0 : ulp_distance(metric_diff.baseline, metric_diff.resumed);
      if (!metric_diff.bit_equal) {
        found[row.iteration].push_back("metric " + name + " (" + it->second + " vs " + text + ")");
        auto [first, inserted] = metric_first.emplace(name, row.iteration);
        if (inserted) metric_order.push_back(name);
        else first->second = std::min(first->second, row.iteration);
      }
      if (diffs) diffs->push_back(metric_diff);
    }
  }
  Difference diff;
  if (found.empty()) return diff;
  const auto& [first_iteration, what] = *found.begin();
  diff.iteration = first_iteration;
  diff.what = "iteration " + std::to_string(first_iteration) + ": ";
  for (size_t i = 0; i < what.size(); ++i) diff.what += (i ? ", " : "") + what[i];
  // Each metric that matched there and differs later, from its own first iteration: "lr at 11;
  // loss from 12" says step 11's forward matched and its update did not.
  std::string later;
  for (const auto& name : metric_order)
    if (metric_first[name] > first_iteration)
      later += (later.empty() ? "" : ", ") + name + " from " + std::to_string(metric_first[name]);
  if (!later.empty()) diff.what += "; " + later;
  return diff;
}

void offer_missing(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                   Difference& diff) {
  for (const auto& row : ref.rows)
    if (row.iteration >= lo && row.iteration <= hi && !got.find(row.iteration))
      diff.offer(row.iteration,
                 "iteration " + std::to_string(row.iteration) + ": not logged by the " + got_name + " run");
}

Difference compare_probe_steps(const std::vector<ProbeRecord>& ref, const std::vector<ProbeRecord>& got, int64_t lo,
                               int64_t hi, const std::set<std::string>& skip_keys) {
  Difference diff;
  for (const auto& record : got) {
    if (record.event != "step" || record.iteration < lo || record.iteration > hi) continue;
    const ProbeRecord* ref_record = probe_step(ref, record.iteration);
    if (!ref_record) continue;   // rows missing are the metrics' business
    // The state first (the batch, the RNG streams, then parameters): the cause before the loss.
    std::string key = first_differing(ref_record->state, record.state, "", skip_keys);
    if (key.empty()) key = first_differing(ref_record->metrics, record.metrics);
    if (!key.empty()) diff.offer(record.iteration, "iteration " + std::to_string(record.iteration) + ": " + key);
  }
  return diff;
}

}   // namespace rh::external
