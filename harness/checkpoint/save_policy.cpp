// The save policy's one schema; see save_policy.h.
#include "harness/checkpoint/save_policy.h"

#include <iterator>
#include <stdexcept>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"

namespace rh::ckpt {

namespace {

struct KindName {
  SavePolicyKind kind;
  const char* name;
  const char* alias;   // another accepted name, or null
};

// In the order help texts list them.
constexpr KindName kKinds[] = {
    {SavePolicyKind::native, "native", nullptr},
    {SavePolicyKind::dp_reshardable, "dp_reshardable", "fp32"},
    {SavePolicyKind::fully_reshardable, "fully_reshardable", nullptr},
    {SavePolicyKind::dp_zero, "dp_zero", nullptr},
    {SavePolicyKind::per_key, "per_key", nullptr},
};

constexpr optim::StateKey kOverrideKeys[] = {optim::StateKey::master_param, optim::StateKey::exp_avg,
                                             optim::StateKey::exp_avg_sq};

}   // namespace

std::string to_string(SavePolicyKind k) {
  for (const auto& e : kKinds)
    if (e.kind == k) return e.name;
  return "?";
}

SavePolicyKind parse_save_policy(const std::string& s) {
  for (const auto& e : kKinds)
    if (s == e.name || (e.alias && s == e.alias)) return e.kind;
  std::string all;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    all += i == 0 ? "" : i + 1 == std::size(kKinds) ? " or " : ", ";
    all += kKinds[i].name;
    if (kKinds[i].alias) all += std::string(" (alias ") + kKinds[i].alias + ")";
  }
  throw std::invalid_argument("unknown save policy '" + s + "' (expected " + all + ")");
}

const std::vector<std::string>& save_policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& e : kKinds) {
      v.push_back(e.name);
      if (e.alias) v.push_back(e.alias);
    }
    return v;
  }();
  return names;
}

std::string save_policy_help() {
  std::string out;
  for (const auto& e : kKinds) {
    out += (out.empty() ? "" : " | ") + std::string(e.name);
    if (e.alias) out += std::string(" (alias ") + e.alias + ")";
  }
  return out;
}

optim::StateKey parse_override_key(const std::string& key, const std::string& what) {
  for (optim::StateKey k : kOverrideKeys)
    if (key == optim::key_name(k)) return k;
  std::string all;
  for (size_t i = 0; i < std::size(kOverrideKeys); ++i)
    all += std::string(i == 0                              ? ""
                       : i + 1 == std::size(kOverrideKeys) ? " or "
                                                           : ", ") +
           optim::key_name(kOverrideKeys[i]);
  throw std::invalid_argument(what + ": expected " + all + ", got '" + quote_text(key) + "'");
}

void set_override(SavePolicy& p, const std::string& key, const std::string& dtype, const std::string& what) {
  p.overrides[optim::key_name(parse_override_key(key, what))] = optim::parse_dtype(dtype, what);
}

SavePolicy parse_save_policy_args(const std::string& kind, const std::vector<std::string>& overrides) {
  SavePolicy p;
  p.kind = parse_save_policy(kind);
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("--save-override '" + o + "': expected KEY=DTYPE");
    const std::string key = o.substr(0, eq);
    set_override(p, key, o.substr(eq + 1), "--save-override " + key);
  }
  return p;
}

nlohmann::json to_json(const SavePolicy& p, const char* kind_key) {
  nlohmann::json overrides = nlohmann::json::object();
  for (const auto& [k, d] : p.overrides) overrides[k] = optim::to_string(d);
  return {{kind_key, to_string(p.kind)}, {"overrides", overrides}, {"compress", to_string(p.compress)}};
}

SavePolicy parse_save_policy_json(const JsonField& j, const char* kind_key) {
  SavePolicy p;
  auto checked = [](const JsonField& f, const auto& parse) {
    try {
      return parse(f.str());
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      f.fail(e.what());
    }
  };
  if (j.has(kind_key)) p.kind = checked(j[kind_key], [](const std::string& s) { return parse_save_policy(s); });
  if (j.has("compress")) p.compress = checked(j["compress"], [](const std::string& s) { return parse_compression(s); });
  if (j.has("overrides"))
    j["overrides"].each_member([&](const std::string& k, const JsonField& d) {
      try {
        set_override(p, k, d.str(), "override '" + k + "'");
      } catch (const CheckpointError&) {
        throw;
      } catch (const std::invalid_argument& e) {
        d.fail(e.what());
      }
    });
  return p;
}

}   // namespace rh::ckpt
