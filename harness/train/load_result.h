// load_result.json: what a resumed run says of its load, for the resume check to read.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace rh {

// load_result.json, written by a run with --load into its output directory: {"schema_version": 1,
// "status": "loaded" | "refused", "checkpoint": "<--load>", "iteration": K, "conversions": [...]}
// or, refused, "error_kind" (checkpoint | input | peer | internal), "file", "tensor" (where known)
// and "message" (the error the process exits with).
constexpr int kLoadResultSchema = 1;
constexpr const char* kLoadResultFile = "load_result.json";
struct LoadResult {
  bool loaded = false;
  std::string checkpoint, error_kind, file, tensor, message;
  int64_t iteration = -1;
  std::vector<std::string> conversions;
};
// Throws std::runtime_error naming the file when it is missing, malformed or of another schema.
LoadResult read_load_result(const std::string& path);
// Writes it into out_dir: {"schema_version", "checkpoint": <checkpoint>} with j's fields, every
// path and message as printable UTF-8.
void write_load_result(const std::string& out_dir, const std::string& checkpoint, const nlohmann::json& result);

}   // namespace rh
