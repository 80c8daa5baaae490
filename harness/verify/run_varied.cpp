// Values the harness varies between runs; see run_varied.h.
#include "harness/verify/run_varied.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

namespace rh::external {

namespace {

// One argument of a command line: `--name value`, `--name=value`, `name=value` (nanoGPT's
// configurator) or a bare `--name`; its value as the scenario wrote it and as the run got it.
struct Flag {
  std::string tmpl, value;
  bool valueless = false;
};

bool flag_like(const std::string& token) {
  return token.size() >= 2 && token[0] == '-' && (std::isalpha(static_cast<unsigned char>(token[1])) || token[1] == '-');
}

// `name=value` without dashes: a name of letters, digits, '_', '-', '.' starting with a letter.
bool assignment_like(const std::string& token) {
  const size_t eq = token.find('=');
  if (eq == std::string::npos || eq == 0 || !std::isalpha(static_cast<unsigned char>(token[0]))) return false;
  for (size_t i = 0; i < eq; ++i) {
    const unsigned char c = token[i];
    if (!std::isalnum(c) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

std::map<std::string, Flag> flags_of(const RunSide& side) {
  std::map<std::string, Flag> flags;
  const auto& tmpl = side.argv_template;
  const auto& argv = side.argv;
  const size_t n = std::min(tmpl.size(), argv.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string& token = argv[i];
    if (!flag_like(token) && !assignment_like(token)) continue;
    const size_t eq = token.find('='), teq = tmpl[i].find('=');
    Flag flag;
    std::string name;
    if (eq != std::string::npos && teq != std::string::npos) {
      name = token.substr(0, eq);
      flag.value = token.substr(eq + 1);
      flag.tmpl = tmpl[i].substr(teq + 1);
    } else if (flag_like(token) && i + 1 < n && !flag_like(argv[i + 1])) {
      name = token;
      flag.value = argv[i + 1];
      flag.tmpl = tmpl[i + 1];
      ++i;
    } else if (flag_like(token)) {
      name = token;
      flag.value = "true";
      flag.tmpl = "(given)";
      flag.valueless = true;
    } else {
      continue;
    }
    flags[flag_key(name)] = flag;
  }
  return flags;
}

bool parse_int(const std::string& s, long long& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return end && *end == '\0';
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);   // decimal or the bridge's float.hex text
  return end && *end == '\0';
}

// Whether a saved leaf ("type:value") holds the value the run was given for the flag.
bool holds(const std::string& text, const Flag& flag) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string type = text.substr(0, colon), value = text.substr(colon + 1);
  if (flag.valueless) return type == "bool" && value == "true";
  if (type == "str" || type == "path") return value == flag.value;
  if (type == "int" || type.rfind("numpy.int", 0) == 0 || type.rfind("numpy.uint", 0) == 0) {
    long long saved = 0, given = 0;
    return parse_int(value, saved) && parse_int(flag.value, given) && saved == given;
  }
  if (type == "float" || type.rfind("numpy.float", 0) == 0) {
    double saved = 0, given = 0;
    return parse_double(value, saved) && parse_double(flag.value, given) && saved == given;
  }
  if (type == "bool") {
    std::string given = flag.value;
    std::transform(given.begin(), given.end(), given.begin(), [](unsigned char c) { return std::tolower(c); });
    const bool on = given == "true" || given == "1" || given == "yes", off = given == "false" || given == "0" || given == "no";
    return (value == "true" && on) || (value == "false" && off);
  }
  return false;
}

// A text with the run's own values written as their placeholders: the whole text when it is one of
// the run's expanded arguments, else every occurrence of its directories (longest first; a
// directory that is both {save_dir} and {load_dir} is {save_dir}).
std::string as_placeholders(const std::string& value, const RunSide& side) {
  for (size_t i = 0; i < std::min(side.argv.size(), side.argv_template.size()); ++i)
    if (side.argv[i] == value && side.argv_template[i] != value) return side.argv_template[i];
  std::vector<std::pair<std::string, std::string>> dirs;   // value -> "{name}"
  for (const char* name : {"save_dir", "load_dir", "run_dir"})
    if (auto it = side.vars.find(name); it != side.vars.end() && !it->second.empty())
      dirs.emplace_back(it->second, "{" + std::string(name) + "}");
  std::stable_sort(dirs.begin(), dirs.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  std::string out;
  for (size_t pos = 0; pos < value.size();) {
    bool replaced = false;
    for (const auto& [dir, placeholder] : dirs)
      if (value.compare(pos, dir.size(), dir) == 0) {
        out += placeholder;
        pos += dir.size();
        replaced = true;
        break;
      }
    if (!replaced) out += value[pos++];
  }
  return out;
}

std::string clipped(const std::string& s) { return s.size() > 120 ? s.substr(0, 120) + "..." : s; }

}   // namespace

std::string flag_key(const std::string& name) {
  size_t begin = 0;
  while (begin < name.size() && name[begin] == '-') ++begin;
  std::string key = name.substr(begin);
  for (char& c : key) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return key;
}

std::optional<std::string> harness_varied(const std::string& key, const std::string& a_text,
                                          const std::string& b_text, const RunSide& a, const RunSide& b) {
  // An argument of the same name as the saved key's last component.
  const std::string name = flag_key(key.substr(key.rfind('/') == std::string::npos ? 0 : key.rfind('/') + 1));
  const auto flags_a = flags_of(a), flags_b = flags_of(b);
  const auto fa = flags_a.find(name), fb = flags_b.find(name);
  const bool in_a = fa != flags_a.end(), in_b = fb != flags_b.end();
  auto type_of = [](const std::string& text) { return text.substr(0, text.find(':')); };
  const bool same_type = type_of(a_text) == type_of(b_text);   // else only beside an argument not given
  if (!name.empty() && (in_a || in_b) && (same_type || in_a != in_b)) {
    if (in_a && in_b && fa->second.tmpl == fb->second.tmpl) {
      if (holds(a_text, fa->second) && holds(b_text, fb->second)) return "argument " + name + "=" + fa->second.tmpl;
    } else if ((!in_a || holds(a_text, fa->second)) && (!in_b || holds(b_text, fb->second))) {
      return "argument " + name + " (" + (in_a ? fa->second.tmpl : std::string("not given")) + " vs " +
             (in_b ? fb->second.tmpl : std::string("not given")) + ")";
    }
  }
  // A text holding the run's own directories or one of its expanded arguments.
  const size_t ca = a_text.find(':'), cb = b_text.find(':');
  if (ca == std::string::npos || cb == std::string::npos || a_text.compare(0, ca, b_text, 0, cb) != 0) return std::nullopt;
  const std::string type = a_text.substr(0, ca);
  if (type != "str" && type != "path") return std::nullopt;
  const std::string va = a_text.substr(ca + 1), vb = b_text.substr(cb + 1);
  const std::string na = as_placeholders(va, a), nb = as_placeholders(vb, b);
  if (na == nb && na != va) return "as " + clipped(na);
  return std::nullopt;
}

bool key_glob_match(const std::string& glob, const std::string& key) {
  size_t g = 0, k = 0, star = std::string::npos, resume = 0;
  while (k < key.size()) {
    if (g < glob.size() && (glob[g] == '?' || glob[g] == key[k])) {
      ++g, ++k;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++, resume = k;
    } else if (star != std::string::npos) {
      g = star + 1, k = ++resume;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

}   // namespace rh::external
