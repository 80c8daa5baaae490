// Reading JSON that arrives from outside (safetensors headers, manifests, run configs) without
// trusting it: the nesting depth is bounded before the parser (which recurses) sees the text,
// values quoted in messages are capped, regular files only are opened, with a size cap, and one
// checked accessor (JsonField) reads fields naming the file, the JSON path and the expected type.
// LibTorch-free, so the fuzz targets and the parsers can be built without it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace rh::ckpt {

// Deeper than this is refused before parsing. Our own files nest at most 6 levels.
constexpr int kMaxJsonDepth = 64;
// At most this many characters of any value found in a file are quoted in a message.
constexpr size_t kMaxQuoted = 200;

// The offset of the first '[' or '{' (outside strings) that opens level max_depth + 1, or
// std::string::npos if the text never nests that deep. Linear, no recursion.
size_t json_depth_violation(const char* p, size_t n, int max_depth = kMaxJsonDepth);

// Parses text strictly (one JSON value, only whitespace after it) after the depth check. On any
// problem throws std::invalid_argument "<what>: <reason>"; `what` names the file.
nlohmann::json parse_json_bounded(const char* p, size_t n, const std::string& what,
                                  const nlohmann::json::parser_callback_t& cb = nullptr);
inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& what) {
  return parse_json_bounded(text.data(), text.size(), what);
}

// A value or a string for a message: compact, invalid UTF-8 replaced, control characters
// escaped, cut to kMaxQuoted characters with the full length said.
std::string quote_json(const nlohmann::json& v, size_t max = kMaxQuoted);
std::string quote_text(const std::string& s, size_t max = kMaxQuoted);

// Opens path read-only without blocking (O_NONBLOCK, so a FIFO cannot hang the open), checks with
// fstat that it is a regular file (refusing FIFOs, devices, sockets, directories, naming the
// path and its type), then clears O_NONBLOCK. With no_follow, a symbolic link is refused too.
// Returns the descriptor (O_CLOEXEC) and its size; throws CheckpointError.
int open_regular_file(const std::string& path, uint64_t* size, bool no_follow = false);

// The whole of a regular file of at most max_bytes bytes (more is refused before reading it all:
// a link to /dev/zero cannot exhaust memory). Throws CheckpointError naming the file.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, bool no_follow = false);

// A checked view of one JSON value inside a file: every access names the file, the JSON path
// ("/optimizer/groups/0/step") and the expected type, and throws CheckpointError otherwise.
class JsonField {
 public:
  JsonField(const nlohmann::json& root, std::string file) : j_(&root), file_(std::move(file)) {}

  JsonField operator[](const std::string& key) const;   // object member; missing -> error
  JsonField operator[](size_t i) const;                 // array element; out of range -> error
  bool has(const std::string& key) const;               // an object with that member
  size_t size() const;                                  // array length (must be an array)
  size_t object_size() const;                           // member count (must be an object)
  // Elements of an array / members of an object, each as a checked view.
  void each(const std::function<void(const JsonField&)>& fn) const;
  void each_member(const std::function<void(const std::string&, const JsonField&)>& fn) const;

  std::string str() const;
  bool boolean() const;
  double number() const;
  int64_t i64(int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const;   // an integer in [lo, hi]
  uint64_t u64(uint64_t hi = UINT64_MAX) const;                        // an integer in [0, hi]
  const nlohmann::json& raw() const { return *j_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  JsonField(const nlohmann::json* j, std::string file, std::string path)
      : j_(j), file_(std::move(file)), path_(std::move(path)) {}
  [[noreturn]] void expected(const char* type) const;
  const nlohmann::json* j_;
  std::string file_;
  std::string path_;   // JSON pointer; "" is the root
};

}  // namespace rh::ckpt
