// The checkpoint room's view of base's file helpers (see checked_io.h): each calls base's and
// turns its InputError or FileError into a CheckpointError with the same message.
#include "harness/checkpoint/checked_io.h"

#include <utility>

namespace rh::ckpt {

namespace {

template <class F>
decltype(auto) as_checkpoint_error(F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const InputError& e) {
    throw CheckpointError(e.what());
  } catch (const FileError& e) {
    throw CheckpointError(e.what());
  }
}

}   // namespace

void raise_checkpoint_error(const std::string& message) { throw CheckpointError(message); }

int open_regular_file(const std::string& path, uint64_t* size, bool no_follow) {
  return as_checkpoint_error([&] { return rh::open_regular_file(path, size, no_follow); });
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, bool no_follow) {
  return as_checkpoint_error([&] { return rh::read_regular_file(path, max_bytes, no_follow); });
}

void throw_errno(const std::string& what, const std::string& path) {
  as_checkpoint_error([&] { rh::throw_errno(what, path); });
  throw CheckpointError(what + " " + path);   // not reached: rh::throw_errno always throws
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  as_checkpoint_error([&] { rh::write_all(fd, data, n, path); });
}

void fsync_fd(int fd, const std::string& path) {
  as_checkpoint_error([&] { rh::fsync_fd(fd, path); });
}

void fsync_dir(const std::string& dir) {
  as_checkpoint_error([&] { rh::fsync_dir(dir); });
}

void write_file_durable(const std::string& path, const std::string& content) {
  as_checkpoint_error([&] { rh::write_file_durable(path, content); });
}

void write_file_atomic(const std::string& path, const std::string& content) {
  as_checkpoint_error([&] { rh::write_file_atomic(path, content); });
}

std::string read_small_file(const std::string& path) {
  return as_checkpoint_error([&] { return rh::read_small_file(path); });
}

void remove_tree(const std::string& path) {
  as_checkpoint_error([&] { rh::remove_tree(path); });
}

bool exchange_dirs(const std::string& a, const std::string& b) {
  return as_checkpoint_error([&] { return rh::exchange_dirs(a, b); });
}

void rename_path(const std::string& from, const std::string& to) {
  as_checkpoint_error([&] { rh::rename_path(from, to); });
}

std::vector<uint8_t> hex_decode(const std::string& hex, const std::string& what) {
  return as_checkpoint_error([&] { return rh::hex_decode(hex, what); });
}

}   // namespace rh::ckpt
