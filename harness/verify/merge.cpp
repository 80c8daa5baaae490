// Merging the run directories of a sharded matrix; see merge.h.
#include "harness/verify/merge.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "harness/base/no_follow.h"
#include "harness/base/text.h"
#include "harness/base/input.h"
#include "harness/verify/matrix.h"
#include "harness/verify/scenario_name.h"
#include "harness/verify/writers.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

constexpr uint64_t kMaxSummaryBytes = 512ull << 20;

struct Shard {
  fs::path dir;
  nlohmann::json summary;
  std::string csv;
};

[[noreturn]] void refuse(const fs::path& shard, const std::string& what) {
  throw MergeError("report --merge: " + shard.string() + ": " + what);
}

std::string read_shard_file(const fs::path& dir, const char* name) {
  try {
    return read_regular_file((dir / name).string(), kMaxSummaryBytes, /*no_follow=*/true);
  } catch (const std::exception& e) {
    refuse(dir, std::string("cannot read ") + name +
                    " (is it a run directory written by `matrix --shard I/N`?): " + e.what());
  }
}

// A member of a JSON object with the type asked for, or a refusal naming shard, key and type.
const nlohmann::json& member(const Shard& s, const nlohmann::json& obj, const std::string& key,
                             nlohmann::json::value_t type, const std::string& where) {
  const auto number = [](nlohmann::json::value_t t) {
    return t == nlohmann::json::value_t::number_integer || t == nlohmann::json::value_t::number_unsigned;
  };
  if (!obj.is_object() || !obj.contains(key)) refuse(s.dir, "summary.json: " + where + key + " is missing");
  const auto& v = obj.at(key);
  if (!(v.type() == type || (number(type) && number(v.type()))))
    refuse(s.dir, "summary.json: " + where + key + " has the wrong type (got " + quote_json(v, 60) + ")");
  return v;
}

// RFC 4180 records: a quoted field may hold commas and line breaks. Each record keeps its
// trailing line break, so the records concatenated give the text back.
std::vector<std::string> csv_records(const std::string& text) {
  std::vector<std::string> out;
  bool quoted = false;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '"') quoted = !quoted;
    else if (text[i] == '\n' && !quoted) {
      out.push_back(text.substr(start, i + 1 - start));
      start = i + 1;
    }
  }
  if (start < text.size()) out.push_back(text.substr(start));
  return out;
}

constexpr int64_t kMaxShards = 1024;   // parse_shard's bound (shard.h)

// The fields of one summary.csv record.
std::vector<std::string> csv_fields(const Shard& s, const std::string& record) {
  try {
    const auto parsed = csv_parse(record);
    return parsed.empty() ? std::vector<std::string>{} : parsed.front().fields;
  } catch (const std::exception& e) {
    refuse(s.dir, std::string("summary.csv: ") + e.what());
  }
}

// A summary.csv row against the cell's summary.json entry: every column both files hold
// (summary_row and result_json, writers.cpp) must agree.
void check_row_matches(const Shard& s, const std::vector<std::string>& columns, const std::vector<std::string>& fields,
                       const nlohmann::json& entry) {
  const std::string name = entry.at("name").get<std::string>();
  if (fields.size() != columns.size())
    refuse(s.dir, "summary.csv row '" + quote_text(name) + "' has " + std::to_string(fields.size()) +
                      " fields; expected " + std::to_string(columns.size()) + ", as its header");
  static const std::pair<const char*, const char*> shared[] = {{"scenario", "name"},
                                                               {"expectation", "expectation"},
                                                               {"passed", "passed"},
                                                               {"outcome", "outcome"},
                                                               {"verdict", "verdict"},
                                                               {"first_divergence", "first_divergence"}};
  for (const auto& [column, key] : shared) {
    const auto at = std::find(columns.begin(), columns.end(), column);
    if (at == columns.end() || !entry.contains(key)) continue;
    const auto& v = entry.at(key);
    std::string want = v.is_boolean() ? (v.get<bool>() ? "1" : "0") : v.is_string() ? v.get<std::string>() : v.dump();
    if (want.find_first_of(",\"\r\n") == std::string::npos) {   // written unquoted: csv_parse trims its spaces
      want.erase(0, want.find_first_not_of(' '));
      want.erase(want.find_last_not_of(' ') + 1);
    }
    const std::string& got = fields[static_cast<size_t>(at - columns.begin())];
    if (got != want)
      refuse(s.dir, "summary.csv row '" + quote_text(name) + "' has " + column + " '" + quote_text(got, 80) +
                        "', but summary.json says '" + quote_text(want, 80) + "'; expected the two files to agree");
  }
}

// Copies a cell's directory; a symbolic link anywhere in it is refused (never followed).
void copy_cell_dir(const fs::path& shard, const fs::path& from, const fs::path& to) {
  std::error_code ec;
  const auto st = fs::symlink_status(from, ec);
  if (ec || !fs::is_directory(st)) refuse(shard, "the cell directory " + from.string() + " is missing");
  fs::create_directories(to);
  for (auto it = fs::recursive_directory_iterator(from); it != fs::recursive_directory_iterator(); ++it) {
    const auto s = it->symlink_status();
    const fs::path dest = to / fs::relative(it->path(), from);
    if (fs::is_symlink(s)) refuse(shard, it->path().string() + " is a symbolic link; refusing to copy through it");
    if (fs::is_directory(s)) fs::create_directory(dest);
    else if (fs::is_regular_file(s)) fs::copy_file(it->path(), dest, fs::copy_options::overwrite_existing);
    else refuse(shard, it->path().string() + " is not a regular file or directory");
  }
}

}   // namespace

MergeResult merge_shards(const fs::path& out_dir, const std::vector<fs::path>& shard_dirs, std::ostream& log) {
  if (shard_dirs.empty()) throw MergeError("report --merge: give OUT_DIR and at least one shard run directory");
  std::vector<Shard> shards;
  for (const auto& d : shard_dirs) {
    Shard s{d, {}, {}};
    try {
      s.summary = parse_json_unique(read_shard_file(d, "summary.json"), (d / "summary.json").string());
    } catch (const MergeError&) {
      throw;
    } catch (const std::exception& e) {
      refuse(d, e.what());
    }
    s.csv = read_shard_file(d, "summary.csv");
    std::error_code ec;
    if (fs::equivalent(d, out_dir, ec)) refuse(d, "is OUT_DIR itself; merge into a new directory");
    shards.push_back(std::move(s));
  }

  // One matrix: same count, file, filter, tool and cell list; every index once.
  using vt = nlohmann::json::value_t;
  const Shard& first = shards.front();
  const auto& shard0 = member(first, first.summary, "shard", vt::object, "");
  const int64_t count = member(first, shard0, "count", vt::number_integer, "shard.").get<int64_t>();
  // Bounded before anything is counted up to it (10^12 once grew the "missing" list until out of memory).
  if (count < 1 || count > kMaxShards)
    refuse(first.dir, "summary.json: shard.count " + std::to_string(count) + " is not in 1.." +
                          std::to_string(kMaxShards) + " (matrix --shard I/N)");
  const auto& cells_json = member(first, shard0, "cells", vt::array, "shard.");
  std::vector<std::string> cells;
  std::map<std::string, std::string> dir_names;   // scenarios/<dir> -> the cell written there
  for (const auto& c : cells_json) {
    if (!c.is_string()) refuse(first.dir, "summary.json: shard.cells holds a non-string");
    const std::string name = c.get<std::string>();
    std::string dir_name;
    try {
      dir_name = safe_name(name);
    } catch (const std::exception& e) {
      refuse(first.dir, "summary.json: shard.cells: " + std::string(e.what()));
    }
    const auto [it, fresh] = dir_names.emplace(dir_name, name);
    if (!fresh && it->second == name)
      refuse(first.dir,
             "summary.json: shard.cells names cell '" + quote_text(name) + "' twice; expected each cell once");
    if (!fresh)
      refuse(first.dir, "summary.json: shard.cells '" + quote_text(it->second) + "' and '" + quote_text(name) +
                            "' both become the directory scenarios/" + dir_name +
                            "; expected names that stay distinct");
    cells.push_back(name);
  }
  const auto identity = [&](const Shard& s) {
    const auto& env = member(s, s.summary, "environment", vt::object, "");
    return std::vector<std::string>{member(s, s.summary, "file_xxh3", vt::string, "").get<std::string>(),
                                    member(s, s.summary, "filter", vt::string, "").get<std::string>(),
                                    member(s, env, "harness_version", vt::string, "environment.").get<std::string>(),
                                    member(s, env, "git_commit", vt::string, "environment.").get<std::string>()};
  };
  const auto id0 = identity(first);
  const char* what[] = {"scenario file (file_xxh3)", "--filter", "tool version", "tool git commit"};
  std::set<int64_t> seen_index;
  std::map<std::string, std::pair<size_t, nlohmann::json>> entries;   // cell -> (shard, result)
  for (size_t k = 0; k < shards.size(); ++k) {
    const Shard& s = shards[k];
    const auto& sh = member(s, s.summary, "shard", vt::object, "");
    const int64_t idx = member(s, sh, "index", vt::number_integer, "shard.").get<int64_t>();
    const int64_t n = member(s, sh, "count", vt::number_integer, "shard.").get<int64_t>();
    if (n != count)
      refuse(s.dir, "is shard " + std::to_string(idx) + "/" + std::to_string(n) + ", but " + first.dir.string() +
                        " is one of " + std::to_string(count));
    if (idx < 1 || idx > count)
      refuse(s.dir, "shard.index " + std::to_string(idx) + " is not in 1.." + std::to_string(count));
    if (!seen_index.insert(idx).second)
      refuse(s.dir, "shard " + std::to_string(idx) + "/" + std::to_string(count) + " is given twice");
    const auto id = identity(s);
    for (size_t f = 0; f < id.size(); ++f)
      if (id[f] != id0[f])
        refuse(s.dir, std::string("another ") + what[f] + " than " + first.dir.string() + " ('" + quote_text(id[f]) +
                          "' vs '" + quote_text(id0[f]) + "'): not shards of one matrix");
    if (member(s, sh, "cells", vt::array, "shard.") != cells_json)
      refuse(s.dir, "its shard.cells (the matrix's cells) differ from " + first.dir.string() + "'s");
    for (const auto& e : member(s, s.summary, "scenarios", vt::array, "")) {
      const std::string name = member(s, e, "name", vt::string, "scenarios[].").get<std::string>();
      member(s, e, "passed", vt::boolean, "scenarios[].");
      member(s, e, "verdict", vt::string, "scenarios[].");
      if (std::find(cells.begin(), cells.end(), name) == cells.end())
        refuse(s.dir, "cell '" + quote_text(name) + "' is not one of the matrix's cells");
      if (entries.count(name))
        refuse(s.dir, "cell '" + quote_text(name) + "' is also in " + shards[entries.at(name).first].dir.string());
      entries.emplace(name, std::make_pair(k, e));
    }
  }
  if (static_cast<int64_t>(seen_index.size()) != count) {
    std::string missing;
    for (int64_t i = 1; i <= count; ++i)
      if (!seen_index.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    throw MergeError("report --merge: shard(s) " + missing + " of " + std::to_string(count) + " are missing");
  }
  for (const auto& c : cells)
    if (!entries.count(c))
      throw MergeError("report --merge: cell '" + quote_text(c) + "' is in no shard (a shard's run did not finish?)");

  // summary.csv rows by cell, in the matrix's order; one header. Each row must say what the
  // shard's summary.json says of the cell (the columns both hold), and come once.
  std::map<std::string, std::string> rows;
  std::string header;
  std::vector<std::string> columns;
  for (const auto& s : shards) {
    auto recs = csv_records(s.csv);
    if (recs.empty()) refuse(s.dir, "summary.csv is empty");
    if (header.empty()) {
      header = recs[0];
      columns = csv_fields(s, recs[0]);
    } else if (recs[0] != header) {
      refuse(s.dir, "summary.csv has another header than " + first.dir.string() + "'s");
    }
    std::set<std::string> in_this;
    for (size_t i = 1; i < recs.size(); ++i) {
      const std::vector<std::string> fields = csv_fields(s, recs[i]);
      const std::string name = fields.empty() ? "" : fields[0];
      if (!entries.count(name) || shards[entries.at(name).first].dir != s.dir)
        refuse(s.dir, "summary.csv row '" + quote_text(name) + "' is not a cell of its summary.json");
      if (!in_this.insert(name).second)
        refuse(s.dir, "summary.csv has a second row for cell '" + quote_text(name) + "'; expected one row per cell");
      check_row_matches(s, columns, fields, entries.at(name).second);
      rows[name] = recs[i];
    }
  }
  refuse_symlinks_in_run_dir(out_dir, cells);
  fs::create_directories(out_dir / "scenarios");

  std::string csv = header;
  nlohmann::json list = nlohmann::json::array();
  std::vector<CheckResult> junit;
  MergeResult res;
  double seconds = 0;
  for (const auto& s : shards)
    if (s.summary.contains("seconds") && s.summary.at("seconds").is_number())
      seconds = std::max(seconds, s.summary.at("seconds").get<double>());
  for (const auto& c : cells) {
    const auto& [k, e] = entries.at(c);
    if (!rows.count(c)) refuse(shards[k].dir, "summary.csv has no row for cell '" + quote_text(c) + "'");
    csv += rows.at(c);
    list.push_back(e);
    CheckResult r;
    r.name = c;
    r.passed = e.at("passed").get<bool>();
    r.verdict = e.at("verdict").get<std::string>();
    r.seconds = e.contains("seconds") && e.at("seconds").is_number() ? e.at("seconds").get<double>() : 0.0;
    junit.push_back(r);
    res.failed += r.passed ? 0 : 1;
    const fs::path rel = fs::path("scenarios") / safe_name(c);
    remove_tree_below(out_dir, rel);
    copy_cell_dir(shards[k].dir, shards[k].dir / rel, out_dir / rel);
  }
  res.cells = cells.size();
  nlohmann::json merged = first.summary;
  merged.erase("shard");
  merged["scenarios"] = list;
  merged["failed"] = res.failed;
  merged["total"] = cells.size();
  merged["seconds"] = seconds;   // the longest shard: the wall time of the sharded run
  write_text((out_dir / "summary.csv").string(), csv);
  write_text((out_dir / "summary.json").string(), dump_text(merged, 2) + "\n");
  const std::string file = member(first, first.summary, "file", vt::string, "").get<std::string>();
  write_junit((out_dir / "junit.xml").string(), fs::path(file).stem().string(), junit);
  log << "merged " << shards.size() << " shards: " << (res.cells - res.failed) << " passed, " << res.failed
      << " failed, run directory " << out_dir.string() << "\n";
  return res;
}

}   // namespace rh
