// Bounded input reading (base/input.h) and durable files (base/fsutil.h) as the checkpoint room
// uses them: the same functions and messages, every failure a CheckpointError (errors.h), which
// `inspect` and `train --load` turn into their exit codes (1 damaged, 2 refused). A disk failure
// stays a DiskError (exit 4). LibTorch-free.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/base/fsutil.h"
#include "harness/base/input.h"
#include "harness/checkpoint/errors.h"

namespace rh::ckpt {

// Throws CheckpointError(message): JsonField's Raise for checkpoint files.
[[noreturn]] void raise_checkpoint_error(const std::string& message);

// A checked view of a checkpoint file's JSON: base's JsonField raising CheckpointError; the
// views it hands out (rh::JsonField) raise it too.
class JsonField : public rh::JsonField {
 public:
  JsonField(const nlohmann::json& root, std::string file)
      : rh::JsonField(root, std::move(file), &raise_checkpoint_error) {}
  JsonField(const rh::JsonField& view) : rh::JsonField(view) {}   // keeps the view's Raise
};

// base/input.h's and base/fsutil.h's, raising CheckpointError where those raise InputError or
// FileError (same message).
int open_regular_file(const std::string& path, uint64_t* size, bool no_follow = false);
std::string read_regular_file(const std::string& path, uint64_t max_bytes, bool no_follow = false);
[[noreturn]] void throw_errno(const std::string& what, const std::string& path);
void write_all(int fd, const void* data, size_t n, const std::string& path);
void fsync_fd(int fd, const std::string& path);
void fsync_dir(const std::string& dir);
void write_file_durable(const std::string& path, const std::string& content);
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_small_file(const std::string& path);
void remove_tree(const std::string& path);
bool exchange_dirs(const std::string& a, const std::string& b);
void rename_path(const std::string& from, const std::string& to);
std::vector<uint8_t> hex_decode(const std::string& hex, const std::string& what);

// The helpers that raise nothing of their own, also under ckpt:: (the checkpoint tests and the
// train and verify rooms call them so).
using rh::dump_text;
using rh::fsync_seconds;
using rh::hex_encode;
using rh::is_plain_file_name;
using rh::json_depth_violation;
using rh::kMaxJsonDepth;
using rh::kMaxQuoted;
using rh::kMaxTomlKeyParts;
using rh::non_ascii_position;
using rh::parse_json_bounded;
using rh::parse_json_unique;
using rh::path_exists;
using rh::printable_text;
using rh::quote_json;
using rh::quote_text;
using rh::toml_nesting_position;
using rh::unique_keys_callback;

}   // namespace rh::ckpt
