// Table printers and the matrix, disk and environment tables; see tables.h. Numbers that come
// from summary.csv are shown as the exact text the harness wrote; derived figures (reductions)
// are formatted here, once, by the helpers both printers share.
#include "reports/tables.h"

#include <algorithm>
#include <cmath>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_map>

namespace rh::report {
namespace {

// The matrix table's first-divergence cell: an external cell's diagnosis code before it.
std::string first_divergence_cell(const SummaryRow& r) {
  const std::string where = r.first_divergence.empty() ? "none" : r.first_divergence;
  return r.diagnosis.empty() || r.diagnosis == "none" ? where : "[" + r.diagnosis + "] " + where;
}

}   // namespace

namespace {

namespace fs = std::filesystem;

const char* kDash = "\u2014";   // shown where a value does not apply

bool is_optimizer_kind(const std::string& k) {
  return k == "master_param" || k == "remainder" || k == "exp_avg" || k == "exp_avg_sq";
}

// Every optimizer tensor of the checkpoint is F32: an fp32-policy save without overrides.
bool optimizer_all_f32(const ScenarioData& s) {
  for (const auto& r : s.disk)
    if (is_optimizer_kind(r.kind) && r.dtype != "F32") return false;
  return true;
}

std::string json_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.dump();
}

}   // namespace

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string reduction_text(double pct) {
  // A checkpoint a few metadata bytes larger than its reference would print as "-0.00 %".
  const std::string s = fmt("%.2f %%", pct);
  return s == "-0.00 %" ? "0.00 %" : s;
}

namespace {

void append_md(std::string& o, const std::string& s) {
  for (const char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '\\':
      case '`':
      case '*':
      case '[':
      case ']':
      case '|':
        o += '\\';
        o += c;
        break;
      case '\r':
      case '\n': o += ' '; break;
      default: o += c;
    }
  }
}

void append_md_cell(std::string& o, const std::string& s) {
  if (s.empty()) o += ' ';
  else append_md(o, s);
}

}   // namespace

std::string md_text(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  append_md(o, s);
  return o;
}

std::string md_cell(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 1);
  append_md_cell(o, s);
  return o;
}

std::string md_code(const std::string& s) {
  size_t longest = 0, run = 0;
  std::string body;
  body.reserve(s.size());
  for (const char c : s) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
    body += c == '\r' || c == '\n' ? ' ' : c;
  }
  const std::string fence(longest + 1, '`');
  // A space on each side keeps a backtick at either end from joining the fence (CommonMark strips
  // one space from each side of a span that has both).
  const bool pad =
      !body.empty() && (body.front() == '`' || body.back() == '`' || (body.front() == ' ' && body.back() == ' '));
  return pad ? fence + " " + body + " " + fence : fence + body + fence;
}

std::string to_markdown(const Table& table) {
  std::string markdown = "|";
  for (const auto& heading : table.header) {
    markdown += ' ';
    append_md_cell(markdown, heading);
    markdown += " |";
  }
  markdown += "\n|";
  for (size_t c = 0; c < table.header.size(); ++c)
    markdown += c < table.right.size() && table.right[c] ? " ---: |" : " --- |";
  markdown += '\n';
  for (const auto& row : table.rows) {
    markdown += '|';
    for (const auto& cell : row) {
      markdown += ' ';
      append_md_cell(markdown, cell);
      markdown += " |";
    }
    markdown += '\n';
  }
  return markdown;
}

namespace {

// A relative path as a URL path: bytes outside A-Z a-z 0-9 - _ . ~ / = + percent-encoded, so a
// directory name cannot end the attribute or start a query or fragment.
std::string url_path(const std::string& p) {
  static const char* hex = "0123456789ABCDEF";
  std::string o;
  for (const char ch : p) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || std::strchr("-_.~/=+", c)) {
      o += ch;
    } else {
      o += '%';
      o += hex[c >> 4];
      o += hex[c & 15];
    }
  }
  return o;
}

}   // namespace

std::string to_html(const Table& table) {
  std::string html;
  if (!table.html_fold_summary.empty())
    html += "<details class=\"fold\"" + (table.html_fold_id.empty() ? std::string() : " id=\"" + markup_escape(table.html_fold_id) + "\"") +
            (table.html_fold_open ? " open" : "") + "><summary>" + markup_escape(table.html_fold_summary) +
            "</summary>\n";
  html += table.html_class.empty() ? "<table>\n<thead><tr>" : "<table class=\"" + table.html_class + "\">\n<thead><tr>";
  const auto hidden = [&table](size_t c) {
    return (table.html_hidden_column >= 0 && c == static_cast<size_t>(table.html_hidden_column)) ||
           (table.html_subline_column > 0 && c == static_cast<size_t>(table.html_subline_column));
  };
  for (size_t c = 0; c < table.header.size(); ++c) {
    if (hidden(c)) continue;
    // A header may break after '_' and '/' ("max ULP exp_<wbr>avg_<wbr>sq"): its longest word would
    // otherwise set the column's width.
    std::string heading;
    for (const char ch : markup_escape(table.header[c]))
      heading += ch == '_' ? std::string("_<wbr>") : ch == '/' ? std::string("/<wbr>") : std::string(1, ch);
    html += "<th>" + heading + "</th>";
  }
  html += "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const std::string* group = i < table.row_group.size() ? &table.row_group[i] : nullptr;
    const std::string& cls = i < table.row_class.size() ? table.row_class[i] : std::string();
    if (cls.empty()) html += "<tr>";
    else html += "<tr class=\"" + cls + "\">";
    for (size_t c = 0; c < table.rows[i].size(); ++c) {
      if (hidden(c)) continue;
      const bool numeric = c < table.right.size() && table.right[c];
      const std::string* extra =
          i < table.cell_class.size() && c < table.cell_class[i].size() && !table.cell_class[i][c].empty()
              ? &table.cell_class[i][c]
              : nullptr;
      html += "<td";
      if (numeric || extra) {
        html += " class=\"";
        if (numeric) html += "num";
        if (numeric && extra) html += ' ';
        if (extra) html += *extra;
        html += '"';
      }
      if (i < table.cell_title.size() && c < table.cell_title[i].size() && !table.cell_title[i][c].empty())
        html += " title=\"" + markup_escape(table.cell_title[i][c]) + "\"";
      html += '>';
      const std::string* href =
          c == 0 && i < table.row_href.size() && !table.row_href[i].empty() ? &table.row_href[i] : nullptr;
      if (href) html += "<a href=\"" + url_path(*href) + "\">";
      if (c == 0 && group) {
        const std::string& name = table.rows[i][c];
        const std::string prefix = *group + "/";
        const std::string shown = name.compare(0, prefix.size(), prefix) == 0 && name.size() > prefix.size()
                                      ? name.substr(prefix.size())
                                      : name;
        for (const char ch : markup_escape(shown)) html += ch == ',' ? std::string(",<wbr>") : std::string(1, ch);
      } else {
        html += markup_escape(table.rows[i][c]);
      }
      if (c == 0 && table.html_subline_column > 0 &&
          static_cast<size_t>(table.html_subline_column) < table.rows[i].size() &&
          !table.rows[i][static_cast<size_t>(table.html_subline_column)].empty()) {
        if (href) html += "</a>", href = nullptr;
        html += "<div class=\"sub\">" + markup_escape(table.rows[i][static_cast<size_t>(table.html_subline_column)]) +
                "</div>";
      }
      if (href) html += "</a>";
      html += "</td>";
    }
    html += "</tr>\n";
  }
  return html + "</tbody>\n</table>\n" + (table.html_fold_summary.empty() ? "" : "</details>\n");
}

std::vector<int> fp32_references(const RunData& run) {
  // The reference of a configuration does not depend on which of its scenarios asks: one pass
  // finds it for every configuration (the first of the highest score, in summary.csv order), a
  // second hands it out. Comparing every scenario with every other took hours at 100,000 rows.
  const size_t n = run.scenarios.size();
  std::vector<std::string> key(n);
  for (size_t i = 0; i < n; ++i)
    if (!run.scenarios[i].config.is_null()) key[i] = run.scenarios[i].config.dump();
  struct Best {
    int scenario = -1, score = -1;
  };
  std::unordered_map<std::string, Best> best;   // config -> its reference
  for (size_t j = 0; j < n; ++j) {
    if (key[j].empty()) continue;
    const auto& c = run.scenarios[j];
    // Megatron's dp_reshardable, "fp32" in runs written before it took that name.
    const bool fp32_states = c.row.save_policy == "dp_reshardable" || c.row.save_policy == "fp32";
    if (!fp32_states || c.row.checkpoint_bytes.value <= 0) continue;
    const int score = (c.has_disk && optimizer_all_f32(c) ? 2 : 0) + (c.row.fault == "none" ? 1 : 0);
    Best& b = best[key[j]];
    if (score > b.score) b = {static_cast<int>(j), score};
  }
  std::vector<int> refs(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (key[i].empty()) continue;
    const auto it = best.find(key[i]);
    if (it != best.end()) refs[i] = it->second.scenario;
  }
  return refs;
}

std::map<std::string, uint64_t> bytes_by_kind(const ScenarioData& scenario) {
  std::map<std::string, uint64_t> bytes;
  for (const auto& entry : scenario.disk) bytes[entry.kind] += entry.bytes;
  return bytes;
}

std::vector<Combo> storage_combos(const RunData& run, const std::vector<int>& refs) {
  std::vector<Combo> combos;
  std::map<std::string, size_t> by_label;
  auto total = [](const std::map<std::string, uint64_t>& bytes) {
    uint64_t sum = 0;
    for (const auto& [kind, count] : bytes) sum += count;
    return sum;
  };
  for (size_t i = 0; i < run.scenarios.size(); ++i) {
    const auto& scenario = run.scenarios[i];
    if (!scenario.has_disk || scenario.disk.empty()) continue;
    std::map<std::string, std::set<std::string>> dtypes_by_kind;
    for (const auto& entry : scenario.disk)
      if (entry.kind != "metadata") dtypes_by_kind[entry.kind].insert(entry.dtype);
    Combo combo;
    combo.policy = scenario.row.save_policy;
    std::string parts;
    for (const auto& kind : disk_kinds()) {
      if (!dtypes_by_kind.count(kind)) continue;
      std::string dtypes;
      for (const auto& dtype : dtypes_by_kind[kind]) dtypes += (dtypes.empty() ? "" : "+") + dtype;
      combo.dtypes[kind] = dtypes;
      parts += (parts.empty() ? "" : ", ") + kind + " " + dtypes;
    }
    // A compressed checkpoint stores the same dtypes in fewer bytes: its own configuration, never
    // merged with (or standing in for) the uncompressed one.
    combo.compress = scenario.row.compress;
    combo.label = combo.policy_label() + ": " + parts;
    const bool has_ref = refs[i] >= 0 && run.scenarios[static_cast<size_t>(refs[i])].has_disk;
    auto it = by_label.find(combo.label);
    if (it != by_label.end()) {
      // Keep the first measurement unless it lacks a reference and this one has one.
      if (combos[it->second].has_reduction || !has_ref) continue;
    }
    combo.scenario = i;
    combo.bytes = bytes_by_kind(scenario);
    combo.total_bytes = total(combo.bytes);
    combo.payload_bytes = combo.total_bytes - (combo.bytes.count("metadata") ? combo.bytes["metadata"] : 0);
    combo.num_params = static_cast<uint64_t>(scenario.row.num_params.value);
    combo.payload_per_param =
        combo.num_params ? static_cast<double>(combo.payload_bytes) / static_cast<double>(combo.num_params) : 0;
    if (has_ref) {
      const auto& reference = run.scenarios[static_cast<size_t>(refs[i])];
      auto ref_bytes = bytes_by_kind(reference);
      const uint64_t ref_total = total(ref_bytes),
                     ref_payload = ref_total - (ref_bytes.count("metadata") ? ref_bytes["metadata"] : 0);
      const double ref_params = reference.row.num_params.value;
      combo.reference = refs[i];
      combo.has_reduction = ref_total > 0 && ref_payload > 0 && ref_params > 0 && combo.num_params > 0;
      if (combo.has_reduction) {
        combo.reduction_pct = 100.0 * (1.0 - static_cast<double>(combo.total_bytes) / static_cast<double>(ref_total));
        combo.payload_reduction_pct =
            100.0 * (1.0 - combo.payload_per_param / (static_cast<double>(ref_payload) / ref_params));
      }
    }
    if (it != by_label.end()) {
      combos[it->second] = combo;
    } else {
      by_label[combo.label] = combos.size();
      combos.push_back(combo);
    }
  }
  return combos;
}

std::string human(const Num& n) {
  if (n.value == 0) return "0";
  if (!std::isfinite(n.value)) return n.text;   // "inf", "nan" as written
  // Whole numbers (bytes, counts) as written; the rest to 4 significant digits.
  if (n.value == std::floor(n.value) && std::fabs(n.value) < 1e15) return n.text;
  return fmt("%.4g", n.value);
}

Table matrix_table(const RunData& run, const std::vector<int>& refs) {
  // Only the key kinds that some scenario's checkpoint holds get a column.
  std::vector<std::string> kinds;
  for (const auto& k : ulp_kinds())
    for (const auto& s : run.scenarios)
      if (s.row.max_ulp.count(k)) {
        kinds.push_back(k);
        break;
      }
  Table table;
  table.header = {"scenario", "expectation", "outcome", "verdict", "first divergence", "max |d loss| after resume"};
  for (const auto& k : kinds) table.header.push_back("max ULP " + k);
  bool compressed = false;   // a column for bytes/param without compression, when any cell compresses
  for (const auto& s : run.scenarios) compressed = compressed || s.row.compress != "none";
  for (const char* h : {"checkpoint bytes", "bytes/param"}) table.header.push_back(h);
  if (compressed) table.header.push_back("bytes/param uncompressed");
  table.header.push_back("reduction vs fp32 policy");
  table.right.assign(table.header.size(), true);
  for (size_t c = 0; c < 5; ++c) table.right[c] = false;
  // In report.html the verdict is the outcome's hover text: sixteen columns do not fit 1280 px.
  table.html_class = "matrix";
  table.html_hidden_column = 3;
  table.html_subline_column = 4;   // the first divergence, under the name
  for (size_t i = 0; i < run.scenarios.size(); ++i) {
    const auto& summary = run.scenarios[i].row;
    const bool compared = summary.outcome != Outcome::error && summary.outcome != Outcome::load_refused &&
                          summary.outcome != Outcome::nondeterministic;
    std::vector<std::string> row = {summary.scenario,
                                    summary.expectation,
                                    to_string(summary.outcome),
                                    summary.verdict,
                                    first_divergence_cell(summary),
                                    compared ? human(summary.max_abs_dloss) : kDash};
    for (const auto& k : kinds) row.push_back(summary.max_ulp.count(k) ? summary.max_ulp.at(k).text : kDash);
    row.push_back(summary.checkpoint_bytes.text);
    row.push_back(human(summary.bytes_per_param));
    if (compressed)
      row.push_back(summary.compress != "none" ? human(summary.raw_bytes_per_param) + " (" + summary.compress + ")"
                                               : kDash);
    if (refs[i] == static_cast<int>(i)) {
      row.push_back("reference");
    } else if (refs[i] >= 0 && summary.checkpoint_bytes.value > 0) {
      const double ref = run.scenarios[static_cast<size_t>(refs[i])].row.checkpoint_bytes.value;
      row.push_back(reduction_text(100.0 * (1.0 - summary.checkpoint_bytes.value / ref)));
    } else {
      row.push_back(kDash);
    }
    std::vector<std::string> title(row.size());
    title[2] = summary.verdict;   // the outcome's hover text: the verdict column is hidden in HTML
    table.cell_title.push_back(std::move(title));
    table.rows.push_back(row);
    table.row_class.push_back(summary.passed ? "pass" : "fail");
    table.row_group.push_back(run.scenarios[i].group);
    // A scenario that errored before writing anything has no directory to link.
    std::error_code ec;
    table.row_href.push_back(
        fs::is_directory(fs::path(run.dir) / run.scenarios[i].rel_dir, ec) ? run.scenarios[i].rel_dir + "/" : "");
  }
  return table;
}

Table disk_table(const RunData& run, const std::vector<Combo>& combos) {
  Table table;
  table.header = {"storage (save policy: dtype per key)", "measured in"};
  for (const auto& k : disk_kinds()) table.header.push_back(k + " bytes");
  for (const char* h : {"total bytes", "bytes/param (without metadata)", "reduction vs fp32 policy"})
    table.header.push_back(h);
  table.right.assign(table.header.size(), true);
  table.right[0] = table.right[1] = false;
  for (const auto& combo : combos) {
    std::vector<std::string> row = {combo.label, run.scenarios[combo.scenario].row.scenario};
    for (const auto& k : disk_kinds()) row.push_back(combo.bytes.count(k) ? std::to_string(combo.bytes.at(k)) : kDash);
    row.push_back(std::to_string(combo.total_bytes));
    row.push_back(combo.num_params ? fmt("%.4f", combo.payload_per_param) : kDash);
    row.push_back(combo.reference == static_cast<int>(combo.scenario) ? "reference"
                  : combo.has_reduction                               ? reduction_text(combo.reduction_pct)
                                                                      : kDash);
    table.rows.push_back(row);
  }
  return table;
}

Table environment_table(const RunData& run) {
  Table table;
  table.header = {"setting", "value"};
  table.right = {false, false};
  static const std::vector<std::pair<const char*, const char*>> keys = {{"harness_version", "harness version"},
                                                                        {"git_commit", "harness commit"},
                                                                        {"torch_version", "LibTorch"},
                                                                        {"blas", "BLAS"},
                                                                        {"cuda_compiled", "CUDA compiled in"},
                                                                        {"device", "device"},
                                                                        {"threads_per_process", "threads per process"},
                                                                        {"jobs", "scenarios run at a time"}};
  const auto& environment = run.environment;
  for (const auto& [k, label] : keys)
    table.rows.push_back({label, environment.is_object() && environment.contains(k) ? json_text(environment[k])
                                                                                    : std::string("unknown")});
  if (!run.matrix_file.empty()) table.rows.push_back({"scenario file", run.matrix_file});
  if (!run.total_seconds.empty()) table.rows.push_back({"wall time of the run (s)", run.total_seconds});
  return table;
}

StatusCounts status_counts(const RunData& run) {
  StatusCounts c;
  for (const auto& s : run.scenarios) {
    ++c.scenarios;
    if (!s.row.passed) {
      ++c.failed;
      continue;
    }
    ++c.met;
    switch (s.row.outcome) {
      case Outcome::identical: ++c.exact; break;
      case Outcome::within_tolerance: ++c.tolerance; break;
      case Outcome::load_refused: ++c.refused; break;
      default: ++c.diverged;
    }
  }
  return c;
}

std::string status_line(const StatusCounts& c) {
  auto n = [](size_t v) { return std::to_string(v); };
  return std::string(c.passed() ? "PASSED" : "FAILED") + ": " + n(c.scenarios) + " scenarios, " + n(c.met) +
         " met their expectation (" + n(c.exact) + " bit for bit, " + n(c.tolerance) + " within tolerance, " +
         n(c.diverged) + " diverged as declared, " + n(c.refused) + " refused as declared), " + n(c.failed) + " failed";
}

std::string outcome_class(const SummaryRow& r) {
  if (!r.passed) return "failed";
  if (r.outcome == Outcome::identical) return "identical";
  if (r.outcome == Outcome::within_tolerance) return "within tolerance";
  return "diverged as expected";
}

namespace {

// "a=1,b=2" -> {(a, 1), (b, 2)}; a part without '=' is ("scenario", part).
std::vector<std::pair<std::string, std::string>> axis_values(const std::string& rest) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start <= rest.size()) {
    const size_t comma = rest.find(',', start);
    const std::string part = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = part.find('=');
    if (eq == std::string::npos) out.push_back({"scenario", part});
    else out.push_back({part.substr(0, eq), part.substr(eq + 1)});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Distinct strings in order of first appearance, each found in constant time (a linear search per
// scenario made the grids quadratic in the rows of a group).
struct Ordered {
  std::vector<std::string> items;
  std::unordered_map<std::string, size_t> index;
  size_t add(const std::string& s) {
    const auto [it, inserted] = index.emplace(s, items.size());
    if (inserted) items.push_back(s);
    return it->second;
  }
};

// The grid cell of one scenario: its class and hover text.
void grid_cell(const SummaryRow& r, std::vector<std::string>& line, std::vector<std::string>& cls,
               std::vector<std::string>& title) {
  const std::string o = outcome_class(r);
  line.push_back(o);
  std::string css = "o-" + o;
  std::replace(css.begin(), css.end(), ' ', '-');
  cls.push_back(css);
  title.push_back(r.scenario + ": " + r.verdict +
                  (r.first_divergence.empty() ? "" : " (first divergence: " + r.first_divergence + ")"));
}

}   // namespace

std::vector<OutcomeGrid> outcome_grids(const RunData& run) {
  Ordered groups;
  std::vector<std::vector<size_t>> members;   // per group, its scenarios in summary.csv order
  for (size_t i = 0; i < run.scenarios.size(); ++i) {
    const size_t g = groups.add(run.scenarios[i].group);
    if (g == members.size()) members.emplace_back();
    members[g].push_back(i);
  }
  std::vector<OutcomeGrid> out;
  for (size_t g = 0; g < groups.items.size(); ++g) {
    OutcomeGrid grid{groups.items[g], {}, ""};
    if (members[g].size() == 1) {   // one scenario: its name says more than an axis value would
      const auto& r = run.scenarios[members[g][0]].row;
      std::vector<std::string> line{r.scenario}, cls{""}, title{""};
      grid_cell(r, line, cls, title);
      grid.table.header = {"scenario", "outcome"};
      grid.table.rows.push_back(line);
      grid.table.cell_class.push_back(cls);
      grid.table.cell_title.push_back(title);
      out.push_back(std::move(grid));
      continue;
    }
    // Every scenario's axis values; per axis its distinct values and how many scenarios name it.
    Ordered axes;
    std::vector<Ordered> values;
    std::vector<size_t> named;
    std::vector<std::vector<std::pair<size_t, std::string>>> parts;   // per scenario: (axis, value)
    for (const size_t i : members[g]) {
      const auto& name = run.scenarios[i].row.scenario;
      const size_t slash = name.find('/');
      parts.emplace_back();
      for (const auto& [axis, value] : axis_values(slash == std::string::npos ? "" : name.substr(slash + 1))) {
        const size_t a = axes.add(axis);
        if (a == values.size()) values.emplace_back(), named.push_back(0);
        values[a].add(value);
        ++named[a];
        parts.back().push_back({a, value});
      }
    }
    // Columns: the subset of the axes every scenario names with the most combinations that fit
    // kMaxGridColumns, leaving at least one axis for the rows.
    std::vector<size_t> candidates;
    for (size_t a = 0; a < axes.items.size() && candidates.size() < 12; ++a)
      if (named[a] == members[g].size()) candidates.push_back(a);
    uint32_t best_mask = 0;
    size_t best_product = 1;
    for (uint32_t mask = 1; mask < (1u << candidates.size()); ++mask) {
      if (static_cast<size_t>(__builtin_popcount(mask)) == axes.items.size()) continue;
      size_t product = 1;
      for (size_t k = 0; k < candidates.size() && product <= kMaxGridColumns; ++k)
        if (mask >> k & 1) product *= values[candidates[k]].items.size();
      if (product > kMaxGridColumns) continue;
      const int pc = __builtin_popcount(mask), best_pc = __builtin_popcount(best_mask);
      if (product > best_product ||
          (product == best_product && best_mask != 0 && (pc < best_pc || (pc == best_pc && mask > best_mask))))
        best_mask = mask, best_product = product;
    }
    std::vector<bool> is_col(axes.items.size(), false);
    for (size_t k = 0; k < candidates.size(); ++k) is_col[candidates[k]] = best_mask >> k & 1;
    std::vector<size_t> row_axes, col_axes;
    for (size_t a = 0; a < axes.items.size(); ++a) (is_col[a] ? col_axes : row_axes).push_back(a);
    // One row axis that every scenario names: its values alone label the rows.
    const bool bare_rows = row_axes.size() == 1 && named[row_axes[0]] == members[g].size();
    Ordered rows, cols;
    std::unordered_map<uint64_t, const SummaryRow*> cells;          // (row << 32 | col) -> first scenario there
    std::vector<std::pair<uint64_t, const SummaryRow*>> in_order;   // every scenario's cell, in order
    for (size_t m = 0; m < members[g].size(); ++m) {
      std::string row, col;
      for (const auto& [a, value] : parts[m]) {
        std::string& label = is_col[a] ? col : row;
        label += (label.empty() ? "" : ", ") + (bare_rows && !is_col[a] ? value : axes.items[a] + "=" + value);
      }
      const auto& r = run.scenarios[members[g][m]].row;
      const uint64_t key = static_cast<uint64_t>(rows.add(row)) << 32 | cols.add(col);
      cells.emplace(key, &r);
      in_order.push_back({key, &r});
    }
    auto axis_names = [&](const std::vector<size_t>& list) {
      std::string s;
      for (const size_t a : list) s += (s.empty() ? "" : ", ") + axes.items[a];
      return s;
    };
    // A group whose names share few axis values would make a grid of mostly empty cells, as many
    // as rows x columns (100,000 scenarios of distinct rows and columns: 10^10): past 16 cells per
    // scenario it becomes a list of its cells instead, one row per scenario.
    const size_t grid_cells = rows.items.size() * cols.items.size();
    if (grid_cells > 16 * members[g].size() + 4096) {
      grid.table.header = {axis_names(row_axes), col_axes.empty() ? "columns" : axis_names(col_axes), "outcome"};
      grid.note = std::to_string(rows.items.size()) + " rows x " + std::to_string(cols.items.size()) +
                  " columns would be mostly empty: one line per scenario instead";
      for (const auto& [key, r] : in_order) {
        std::vector<std::string> line{rows.items[key >> 32], cols.items[key & 0xffffffffu]}, cls{"", ""}, title{"", ""};
        grid_cell(*r, line, cls, title);
        grid.table.rows.push_back(line);
        grid.table.cell_class.push_back(cls);
        grid.table.cell_title.push_back(title);
      }
      out.push_back(std::move(grid));
      continue;
    }
    grid.table.header.push_back(axis_names(row_axes) + (col_axes.empty() ? "" : " \\ " + axis_names(col_axes)));
    for (const auto& c : cols.items) grid.table.header.push_back(c.empty() ? "outcome" : c);
    for (size_t r = 0; r < rows.items.size(); ++r) {
      std::vector<std::string> line{rows.items[r]}, cls{""}, title{""};
      for (size_t c = 0; c < cols.items.size(); ++c) {
        const auto it = cells.find(static_cast<uint64_t>(r) << 32 | c);
        if (it == cells.end()) {
          line.push_back("\u2014");
          cls.push_back("o-none");
          title.push_back("");
          continue;
        }
        grid_cell(*it->second, line, cls, title);
      }
      grid.table.rows.push_back(line);
      grid.table.cell_class.push_back(cls);
      grid.table.cell_title.push_back(title);
    }
    out.push_back(std::move(grid));
  }
  return out;
}

}   // namespace rh::report
