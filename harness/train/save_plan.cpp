// The save plan file; see save_plan.h.
#include "harness/train/save_plan.h"

#include <stdexcept>

#include "harness/base/text.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/checked_io.h"

namespace rh {

void write_save_plan(const std::string& path, const std::vector<SaveTarget>& saves) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& target : saves) {
    nlohmann::json entry = ckpt::to_json(target.policy, "policy");
    entry["root"] = target.root;
    list.push_back(entry);
  }
  write_text(path, ckpt::dump_text(nlohmann::json{{"schema_version", kSavePlanSchema}, {"saves", list}}, 2) + "\n");
}

// Every field through the checked accessor, so a refusal names the plan, the JSON path and what
// was expected ("schema_version": "1" once gave a bare nlohmann type_error).
std::vector<SaveTarget> read_save_plan(const std::string& path) try {
  const std::string what = "save plan " + path;
  const nlohmann::json document = ckpt::parse_json_unique(ckpt::read_regular_file(path, 1u << 20), what);
  const ckpt::JsonField plan(document, what);
  if (!document.is_object())
    plan.fail("expected {\"schema_version\": " + std::to_string(kSavePlanSchema) + ", \"saves\": [...]}");
  const int64_t schema = plan["schema_version"].i64();
  if (schema != kSavePlanSchema)
    plan["schema_version"].fail("expected " + std::to_string(kSavePlanSchema) + ", got " + std::to_string(schema));
  std::vector<SaveTarget> out;
  plan["saves"].each([&](const ckpt::JsonField& entry) {
    SaveTarget target;
    target.root = entry["root"].str();
    if (target.root.empty()) entry["root"].fail("expected a non-empty checkpoint root");
    // A path is a C string to the kernel: "a\u0000b" would save into "a".
    if (const size_t z = target.root.find('\0'); z != std::string::npos)
      entry["root"].fail("NUL byte at character " + std::to_string(z) + " of '" + ckpt::quote_text(target.root) +
                         "' (a path cannot hold one)");
    target.policy = ckpt::parse_save_policy_json(entry, "policy");
    out.push_back(target);
  });
  return out;
} catch (const ckpt::CheckpointError& e) {   // bad input to the train command, as before
  throw std::invalid_argument(e.what());
}

}   // namespace rh
