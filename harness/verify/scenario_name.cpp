#include "harness/verify/scenario_name.h"

#include <cctype>
#include <cstdio>

namespace rh {

std::string quote_name(const std::string& name) {
  std::string q;
  for (char c : name) {
    if (q.size() >= 200) return "'" + q + "...' (" + std::to_string(name.size()) + " bytes)";
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      q += buf;
    } else {
      q += c;
    }
  }
  return "'" + q + "'";
}

std::string safe_name(const std::string& canonical) {
  auto refuse = [&](const std::string& why) {
    throw ScenarioError("scenario name " + quote_name(canonical) + " " + why);
  };
  if (canonical.empty()) refuse("is empty");
  if (canonical == "." || canonical == "..") refuse("would name the scenarios directory itself or its parent");
  std::string out;
  for (char c : canonical) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) refuse("contains a control character");
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '=') out += c;
    else if (c == '/') out += "__";
    else out += '+';
  }
  // Room for ".csv" (golden files) within NAME_MAX (255).
  if (out.size() > kMaxScenarioDirName)
    refuse("gives a directory name of " + std::to_string(out.size()) + " bytes, more than " +
           std::to_string(kMaxScenarioDirName));
  return out;
}

}   // namespace rh
