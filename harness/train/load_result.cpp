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
  const nlohmann::json j = ckpt::parse_json_unique(ckpt::read_regular_file(path, 1u << 20), path);
  const ckpt::JsonField f(j, path);
  if (!j.is_object()) f.fail("expected a load result object");
  if (f["schema_version"].i64() != kLoadResultSchema)
    f["schema_version"].fail("expected " + std::to_string(kLoadResultSchema));
  LoadResult r;
  const std::string status = f["status"].str();
  if (status != "loaded" && status != "refused")
    f["status"].fail("'" + ckpt::quote_text(status) + "', expected loaded or refused");
  r.loaded = status == "loaded";
  auto text = [&](const char* k) { return f.has(k) ? f[k].str() : std::string(); };
  r.checkpoint = text("checkpoint");
  r.iteration = f.has("iteration") ? f["iteration"].i64() : -1;
  r.error_kind = text("error_kind");
  r.file = text("file");
  r.tensor = text("tensor");
  r.message = text("message");
  if (f.has("conversions")) f["conversions"].each([&](const ckpt::JsonField& c) { r.conversions.push_back(c.str()); });
  return r;
} catch (const ckpt::CheckpointError& e) {
  throw std::runtime_error(e.what());
} catch (const std::invalid_argument& e) {   // parse_json_unique: not JSON, a duplicate key
  throw std::runtime_error(e.what());
}

void write_load_result(const std::string& out_dir, const std::string& checkpoint, const nlohmann::json& j) {
  // Paths and messages as printable UTF-8 (a checkpoint path that is not UTF-8 once made dump()
  // throw nlohmann's type_error 316, and the load "fail" with that message).
  nlohmann::json all = {{"schema_version", kLoadResultSchema}, {"checkpoint", ckpt::printable_text(checkpoint)}};
  all.update(j);
  for (const char* k : {"message", "file", "checkpoint"})
    if (all.contains(k) && all[k].is_string()) all[k] = ckpt::printable_text(all[k].get<std::string>());
  write_text((std::filesystem::path(out_dir) / kLoadResultFile).string(), ckpt::dump_text(all, 2) + "\n");
}

}   // namespace rh
