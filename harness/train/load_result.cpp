// load_result.json; see load_result.h.
#include "harness/train/load_result.h"

#include <filesystem>
#include <stdexcept>

#include "harness/base/text.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/checked_io.h"

namespace rh {

// Through the checked accessor: a field of the wrong type names the file and field (value() threw
// nlohmann's type_error for "status": 1). Errors are runtime_errors, as before.
LoadResult read_load_result(const std::string& path) try {
  const nlohmann::json document = ckpt::parse_json_unique(ckpt::read_regular_file(path, 1u << 20), path);
  const ckpt::JsonField root(document, path);
  if (!document.is_object()) root.fail("expected a load result object");
  if (root["schema_version"].i64() != kLoadResultSchema)
    root["schema_version"].fail("expected " + std::to_string(kLoadResultSchema));
  LoadResult result;
  const std::string status = root["status"].str();
  if (status != "loaded" && status != "refused")
    root["status"].fail("'" + ckpt::quote_text(status) + "', expected loaded or refused");
  result.loaded = status == "loaded";
  auto text = [&](const char* key) { return root.has(key) ? root[key].str() : std::string(); };
  result.checkpoint = text("checkpoint");
  result.iteration = root.has("iteration") ? root["iteration"].i64() : -1;
  result.error_kind = text("error_kind");
  result.file = text("file");
  result.tensor = text("tensor");
  result.message = text("message");
  if (root.has("conversions"))
    root["conversions"].each([&](const ckpt::JsonField& c) { result.conversions.push_back(c.str()); });
  return result;
} catch (const ckpt::CheckpointError& e) {
  throw std::runtime_error(e.what());
} catch (const std::invalid_argument& e) {   // parse_json_unique: not JSON, a duplicate key
  throw std::runtime_error(e.what());
}

void write_load_result(const std::string& out_dir, const std::string& checkpoint, const nlohmann::json& result) {
  // Paths and messages as printable UTF-8 (a checkpoint path that is not UTF-8 once made dump()
  // throw nlohmann's type_error 316, and the load "fail" with that message).
  nlohmann::json all = {{"schema_version", kLoadResultSchema}, {"checkpoint", ckpt::printable_text(checkpoint)}};
  all.update(result);
  for (const char* k : {"message", "file", "checkpoint"})
    if (all.contains(k) && all[k].is_string()) all[k] = ckpt::printable_text(all[k].get<std::string>());
  write_text((std::filesystem::path(out_dir) / kLoadResultFile).string(), ckpt::dump_text(all, 2) + "\n");
}

}   // namespace rh
