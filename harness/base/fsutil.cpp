// Durable-file helpers (see fsutil.h). POSIX only; the project targets Linux.
#include "harness/base/fsutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "harness/base/input.h"
#include "harness/base/text.h"

namespace rh {

namespace fs = std::filesystem;

void throw_errno(const std::string& what, const std::string& path) {
  const int err = errno;
  throw_if_disk_errno(what, path, err);   // the disk, not the checkpoint: exit 4
  throw FileError(what + " " + path + ": " + std::strerror(err));
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Chunks of at most 1 GiB: Linux write() moves at most ~2 GiB per call anyway.
    ssize_t written = ::write(fd, p, n < (1u << 30) ? n : (1u << 30));
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path);
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
}

namespace {
std::atomic<int64_t> g_fsync_ns{0};
struct FsyncClock {   // adds its lifetime to g_fsync_ns
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~FsyncClock() {
    g_fsync_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
};
}   // namespace

double fsync_seconds() { return static_cast<double>(g_fsync_ns.load()) * 1e-9; }

void fsync_fd(int fd, const std::string& path) {
  FsyncClock clock;
  if (::fsync(fd) != 0) throw_errno("cannot fsync", path);
}

void fsync_dir(const std::string& dir) {
  FsyncClock clock;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) throw_errno("cannot fsync directory", dir);
}

void write_file_durable(const std::string& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", path);
  try {
    write_all(fd, content.data(), content.size(), path);
    fsync_fd(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_errno("cannot close", path);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  try {
    write_file_durable(temp_path, content);
    rename_path(temp_path, path);
  } catch (...) {   // e.g. ENOSPC: no empty temp file is left behind
    ::unlink(temp_path.c_str());
    throw;
  }
  fs::path parent = fs::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

std::string read_small_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t bytes_read = ::read(fd, buf, sizeof buf);
    if (bytes_read < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      errno = err;
      throw_errno("cannot read", path);
    }
    if (bytes_read == 0) break;
    out.append(buf, static_cast<size_t>(bytes_read));
  }
  ::close(fd);
  return out;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw FileError("cannot remove " + path + ": " + ec.message());
}

bool exchange_dirs(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw_errno("cannot exchange " + a + " with", b);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_errno("cannot rename " + from + " to", to);
}

bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name[0] == '.') return false;
  for (char c : name)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

std::string hex_encode(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string hex(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    hex[2 * i] = digits[bytes[i] >> 4];
    hex[2 * i + 1] = digits[bytes[i] & 15];
  }
  return hex;
}

std::vector<uint8_t> hex_decode(const std::string& hex, const std::string& what) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw InputError(what + ": invalid hex character '" + std::string(1, c) + "'");
  };
  if (hex.size() % 2 != 0) throw InputError(what + ": hex string of odd length");
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return out;
}

}   // namespace rh
