// Comparison of two run directories; see compare_runs.h.
#include "reports/compare_runs.h"

#include <filesystem>
#include <map>

#include "harness/base/input.h"
#include "reports/run_data.h"
#include "reports/tables.h"

namespace rh::report {
namespace {

std::string state(const SummaryRow& r) {
  return std::string(r.passed ? "PASS (" : "FAIL (") + to_string(r.outcome) + ")";
}

std::string or_none(const std::string& s) { return s.empty() ? "none" : s; }

nlohmann::json side(const SummaryRow& r) {
  return {{"passed", r.passed}, {"outcome", to_string(r.outcome)}, {"verdict", printable_text(r.verdict)}};
}

nlohmann::json text_or_null(const std::string& s) {
  return s.empty() ? nlohmann::json() : nlohmann::json(printable_text(s));
}

// A byte count as summary.csv holds it: the number where it is one, else null.
nlohmann::json bytes_or_null(const Num& n) { return n.text.empty() ? nlohmann::json() : nlohmann::json(n.value); }

}   // namespace

int compare_runs(const std::string& run_a, const std::string& run_b, std::ostream& out, bool json) {
  namespace fs = std::filesystem;
  const auto a = read_summary_csv((fs::path(run_a) / "summary.csv").string());
  const auto b = read_summary_csv((fs::path(run_b) / "summary.csv").string());
  std::map<std::string, const SummaryRow*> ma, mb;
  for (const auto& r : a) ma[r.scenario] = &r;
  for (const auto& r : b) mb[r.scenario] = &r;

  Table verdicts, divergences, bytes;
  verdicts.header = {"scenario", "A", "B", "change", "verdict in B"};
  verdicts.right = {false, false, false, false, false};
  divergences.header = {"scenario", "first divergence in A", "first divergence in B"};
  divergences.right = {false, false, false};
  bytes.header = {"scenario", "checkpoint bytes A", "checkpoint bytes B", "change"};
  bytes.right = {false, true, true, true};
  std::vector<std::string> only_a, only_b;
  size_t regressions = 0, fixes = 0;
  // The same content for --json; each list in the Markdown's order.
  nlohmann::json j_verdicts = nlohmann::json::array(), j_divergences = nlohmann::json::array(),
                 j_bytes = nlohmann::json::array(), j_only_a = nlohmann::json::array(),
                 j_only_b = nlohmann::json::array();
  for (const auto& rb : b) {   // B's order: the newer run decides how the comment reads
    auto it = ma.find(rb.scenario);
    if (it == ma.end()) {
      only_b.push_back(rb.scenario + ": " + state(rb));
      nlohmann::json e = {{"scenario", printable_text(rb.scenario)}};
      e.update(side(rb));
      j_only_b.push_back(e);
      continue;
    }
    const SummaryRow& ra = *it->second;
    if (ra.passed != rb.passed || ra.outcome != rb.outcome || ra.verdict != rb.verdict) {
      const char* change = ra.passed && !rb.passed ? "regression" : !ra.passed && rb.passed ? "fixed" : "changed";
      regressions += ra.passed && !rb.passed;
      fixes += !ra.passed && rb.passed;
      verdicts.rows.push_back({rb.scenario, state(ra), state(rb), change, rb.verdict});
      verdicts.row_class.push_back(rb.passed ? "pass" : "fail");
      j_verdicts.push_back(
          {{"scenario", printable_text(rb.scenario)}, {"a", side(ra)}, {"b", side(rb)}, {"change", change}});
    }
    if (ra.first_divergence != rb.first_divergence) {
      divergences.rows.push_back({rb.scenario, or_none(ra.first_divergence), or_none(rb.first_divergence)});
      j_divergences.push_back({{"scenario", printable_text(rb.scenario)},
                               {"a", text_or_null(ra.first_divergence)},
                               {"b", text_or_null(rb.first_divergence)}});
    }
    if (ra.checkpoint_bytes.text != rb.checkpoint_bytes.text) {
      const double x = ra.checkpoint_bytes.value, y = rb.checkpoint_bytes.value;
      bytes.rows.push_back({rb.scenario, ra.checkpoint_bytes.text, rb.checkpoint_bytes.text,
                            x > 0 ? fmt("%+.2f %%", 100.0 * (y - x) / x) : "new checkpoint"});
      j_bytes.push_back({{"scenario", printable_text(rb.scenario)},
                         {"a", bytes_or_null(ra.checkpoint_bytes)},
                         {"b", bytes_or_null(rb.checkpoint_bytes)},
                         {"change_percent", x > 0 ? nlohmann::json(100.0 * (y - x) / x) : nlohmann::json()}});
    }
  }
  for (const auto& ra : a)
    if (!mb.count(ra.scenario)) {
      only_a.push_back(ra.scenario + ": " + state(ra));
      nlohmann::json e = {{"scenario", printable_text(ra.scenario)}};
      e.update(side(ra));
      j_only_a.push_back(e);
    }

  auto failed = [](const std::vector<SummaryRow>& v) {
    size_t n = 0;
    for (const auto& r : v) n += !r.passed;
    return n;
  };
  if (json) {
    auto run = [&](const std::string& dir, const std::vector<SummaryRow>& v) {
      return nlohmann::json{{"dir", printable_text(dir)}, {"scenarios", v.size()}, {"failed", failed(v)}};
    };
    const nlohmann::json j = {{"schema_version", 1},
                              {"a", run(run_a, a)},
                              {"b", run(run_b, b)},
                              {"regressions", regressions},
                              {"fixed", fixes},
                              {"verdicts", j_verdicts},
                              {"first_divergences", j_divergences},
                              {"checkpoint_bytes", j_bytes},
                              {"only_in_a", j_only_a},
                              {"only_in_b", j_only_b}};
    out << dump_text(j, 2) << "\n";
    return regressions ? 1 : 0;
  }
  out << "## resume-harness: run comparison\n\n"
      << "- A: " << md_code(run_a) << ": " << a.size() << " scenarios, " << failed(a) << " failed\n"
      << "- B: " << md_code(run_b) << ": " << b.size() << " scenarios, " << failed(b) << " failed\n"
      << "- " << regressions << " regression(s) (passed in A, fail in B), " << fixes << " fixed\n\n";
  const bool none =
      verdicts.rows.empty() && divergences.rows.empty() && bytes.rows.empty() && only_a.empty() && only_b.empty();
  if (none) out << "No differences in verdicts, first divergences or checkpoint bytes.\n";
  if (!verdicts.rows.empty()) out << "### Verdicts\n\n" << to_markdown(verdicts) << "\n";
  if (!divergences.rows.empty()) out << "### First divergences\n\n" << to_markdown(divergences) << "\n";
  if (!bytes.rows.empty()) out << "### Checkpoint bytes\n\n" << to_markdown(bytes) << "\n";
  auto list = [&](const char* title, const std::vector<std::string>& v) {
    if (v.empty()) return;
    out << "### " << title << "\n\n";
    for (const auto& s : v) out << "- " << md_text(s) << "\n";
    out << "\n";
  };
  list("Only in A (removed)", only_a);
  list("Only in B (added)", only_b);
  return regressions ? 1 : 0;
}

}   // namespace rh::report
