// Fuzz entry points of the checkpoint room's parsers (LibTorch-free; see entries.h).
#include <string>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/safetensors_format.h"
#include "tests/fuzz/entries.h"

namespace rh::fuzz {

Outcome safetensors_header(const uint8_t* data, size_t size) {
  try {
    const auto parsed = ckpt::parse_safetensors("fuzz.safetensors", data, size);
    // Everything the reader hands out must lie inside the input.
    for (const auto& t : parsed.tensors)
      if (t.end > size || t.begin > t.end || 8 + parsed.header_len + t.end > size) __builtin_trap();
    return kAccepted;
  } catch (const ckpt::CheckpointError&) {
    return kRefused;
  }
}

Outcome manifest(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    ckpt::detail::ManifestState saved;
    (void)ckpt::detail::parse_manifest_text(text, "fuzz/manifest.json", &saved);
    ckpt::detail::check_counters(saved, {/*iterations=*/20, /*global_batch=*/16}, "fuzz/manifest.json");
    return kAccepted;
  } catch (const ckpt::CheckpointError&) {
    return kRefused;
  }
}

Outcome pointer(const uint8_t* data, size_t size) {
  try {
    const int64_t it =
        ckpt::detail::parse_pointer_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz/pointer");
    if (it < 0 || it > ckpt::detail::kMaxCounter) __builtin_trap();
    return kAccepted;
  } catch (const ckpt::CheckpointError&) {
    return kRefused;
  }
}

}   // namespace rh::fuzz
