// The safetensors format without LibTorch: dtype names, the tensor table, and the validating
// parser of a whole file's bytes (length prefix, JSON header, offsets tiling the buffer). The
// mmap reader (safetensors.h) and the fuzz target both use parse_safetensors().
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rh::ckpt {

enum class StDtype { F32, F16, BF16, F8_E4M3, I16, U8, I32, I64, F64 };
std::string st_name(StDtype d);                      // "F32", "BF16", ...
bool st_parse(const std::string& s, StDtype* out);   // false if unknown
int64_t st_itemsize(StDtype d);

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;   // the reference reader's cap

struct TensorInfo {
  std::string key;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // byte offsets relative to the data buffer
  uint64_t numel() const;
};

struct ParsedSafetensors {
  uint64_t header_len = 0;           // N (the JSON header with its padding)
  std::vector<TensorInfo> tensors;   // sorted by key
  std::map<std::string, std::string> metadata;
};

// Validates the bytes of a whole file: length prefix (>= 2, <= kMaxHeaderBytes, inside the file),
// header starts with '{', nests at most kMaxJsonDepth levels, is one JSON object followed only by
// spaces (no NUL), no duplicate keys, known dtypes, shapes of ints >= 0, offsets in range,
// end - begin == numel * itemsize, tensors tile the buffer exactly (no holes, no overlaps), file
// size == 8 + N + buffer. Throws CheckpointError "safetensors file <path>: ..." naming the tensor.
ParsedSafetensors parse_safetensors(const std::string& path, const uint8_t* data, uint64_t size);

// Throws CheckpointError "safetensors file <path>: <what>", the one message shape of this format.
[[noreturn]] void bad_safetensors(const std::string& path, const std::string& what);

}   // namespace rh::ckpt
