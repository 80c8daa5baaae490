// Directory handles below a root, never through a link; see beneath.h.
#include "harness/base/beneath.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "harness/base/fsutil.h"
#include "harness/base/no_follow.h"
#include "harness/base/text.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

// The components of a relative path the tool built; "" and "." skipped.
std::vector<std::string> components(const fs::path& rel) {
  if (rel.is_absolute()) throw std::logic_error("beneath: " + rel.string() + " is not a relative path");
  std::vector<std::string> parts;
  for (const auto& part : rel) {
    const std::string s = part.string();
    if (s.empty() || s == ".") continue;
    if (s == "..") throw std::logic_error("beneath: " + rel.string() + " leaves its root ('..')");
    parts.push_back(s);
  }
  return parts;
}

[[noreturn]] void throw_write(const std::string& what, const fs::path& path, int err) {
  if (err == ELOOP) throw SymlinkRefused(path.string());
  throw_if_disk_errno(what, path.string(), err);
  throw WriteError(what + " " + path.string() + ": " + std::strerror(err));
}

// One component below dirfd, as a directory, without following a link. -1 with errno ENOENT when
// missing (and not create); a link is a SymlinkRefused naming `shown`.
int open_component(int dirfd, const std::string& name, bool create, const fs::path& shown) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return fd;
    const int err = errno;
    if (err == ELOOP) throw SymlinkRefused(shown.string());
    if (err == ENOTDIR) {
      struct stat st;
      if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        throw SymlinkRefused(shown.string());
      throw FileError(shown.string() + " is not a directory");
    }
    if (err != ENOENT || !create) {
      if (err == ENOENT) return -1;
      throw_write("cannot open", shown, err);
    }
    // mkdirat never follows a link in its last component (an existing link is EEXIST).
    if (::mkdirat(dirfd, name.c_str(), 0755) != 0 && errno != EEXIST) throw_write("cannot create", shown, errno);
    if (attempt > 4) throw_write("cannot open", shown, err);   // made and removed again, repeatedly
  }
}

void remove_entries(int dirfd, const fs::path& shown);

// Removes `name` in dirfd: a directory by its contents first, anything else (a link included:
// the link itself) by unlinkat.
void remove_entry(int dirfd, const std::string& name, const fs::path& shown) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    throw_write("cannot remove", shown, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ELOOP || errno == ENOTDIR) return remove_entry(dirfd, name, shown);   // swapped meanwhile
      if (errno == ENOENT) return;
      throw_write("cannot remove", shown, errno);
    }
    try {
      remove_entries(fd, shown);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) throw_write("cannot remove", shown, errno);
    return;
  }
  if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) {
    if (errno == EISDIR) return remove_entry(dirfd, name, shown);   // swapped for a directory meanwhile
    throw_write("cannot remove", shown, errno);
  }
}

void remove_entries(int dirfd, const fs::path& shown) {
  // Names first, removal after: removing while readdir walks the same stream may skip entries.
  const int dup_fd = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) throw_write("cannot read", shown, errno);
  DIR* d = ::fdopendir(dup_fd);
  if (!d) {
    const int err = errno;
    ::close(dup_fd);
    throw_write("cannot read", shown, err);
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  for (const auto& n : names) remove_entry(dirfd, n, shown / n);
}

}   // namespace

BeneathDir BeneathDir::open(const fs::path& root, const fs::path& below, bool create) {
  if (create) {
    std::error_code ec;
    fs::create_directories(root, ec);   // the root is the user's: made as named, links followed
  }
  const int fd = ::open(root.empty() ? "." : root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_write("cannot open", root, errno);
  BeneathDir top(fd, root);
  return below.empty() ? std::move(top) : top.sub(below, create);
}

BeneathDir::BeneathDir(BeneathDir&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

BeneathDir& BeneathDir::operator=(BeneathDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

BeneathDir::~BeneathDir() {
  if (fd_ >= 0) ::close(fd_);
}

BeneathDir BeneathDir::sub(const fs::path& rel, bool create) const {
  fs::path shown = path_;
  int at = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (at < 0) throw_write("cannot open", path_, errno);
  for (const auto& part : components(rel)) {
    shown /= part;
    int next = -1;
    try {
      next = open_component(at, part, create, shown);
    } catch (...) {
      ::close(at);
      throw;
    }
    ::close(at);
    if (next < 0) throw FileError("cannot open " + shown.string() + ": " + std::strerror(ENOENT));
    at = next;
  }
  return BeneathDir(at, shown);
}

std::pair<BeneathDir, std::string> BeneathDir::parent_of(const fs::path& rel) const {
  auto parts = components(rel);
  if (parts.empty()) throw std::logic_error("beneath: " + rel.string() + " names no entry");
  const std::string last = parts.back();
  parts.pop_back();
  fs::path dir;
  for (const auto& p : parts) dir /= p;
  return {sub(dir), last};
}

unsigned BeneathDir::mode_of(const fs::path& rel) const {
  auto parts = components(rel);
  if (parts.empty()) return S_IFDIR;
  const std::string last = parts.back();
  parts.pop_back();
  fs::path dir, shown = path_;
  for (const auto& p : parts) dir /= p;
  int at = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (at < 0) throw_write("cannot open", path_, errno);
  for (const auto& part : parts) {
    shown /= part;
    int next = -1;
    try {
      next = open_component(at, part, false, shown);
    } catch (...) {
      ::close(at);
      throw;
    }
    ::close(at);
    if (next < 0) return 0;
    at = next;
  }
  struct stat st;
  const int r = ::fstatat(at, last.c_str(), &st, AT_SYMLINK_NOFOLLOW);
  ::close(at);
  return r == 0 ? static_cast<unsigned>(st.st_mode) : 0;
}

int BeneathDir::open_for_write(const fs::path& rel) const {
  auto [dir, name] = parent_of(rel);
  const int fd = ::openat(dir.fd(), name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw_write("cannot write", dir.path() / name, errno);
  return fd;
}

int BeneathDir::open_for_read(const fs::path& rel) const {
  auto [dir, name] = parent_of(rel);
  const int fd = ::openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) throw SymlinkRefused((dir.path() / name).string());
    throw FileError("cannot open " + (dir.path() / name).string() + ": " + std::strerror(errno));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void BeneathDir::write_file(const fs::path& rel, const std::string& text) const {
  auto [dir, name] = parent_of(rel);
  const fs::path shown = dir.path() / name;
  struct stat st;
  if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    throw SymlinkRefused(shown.string());
  // The tool's own temp name (".<name>.tmp.<pid>"), made exclusively: nothing there is opened.
  const std::string tmp = "." + name + ".tmp." + std::to_string(::getpid());
  ::unlinkat(dir.fd(), tmp.c_str(), 0);   // left by a killed run of this pid number
  const int fd = ::openat(dir.fd(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw_write("cannot write", shown, errno);
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlinkat(dir.fd(), tmp.c_str(), 0);
      throw_write("cannot write", shown, err);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlinkat(dir.fd(), tmp.c_str(), 0);
    throw_write("cannot write", shown, err);
  }
  // renameat replaces whatever entry `name` is (a link planted since the check above is replaced,
  // not followed).
  if (::renameat(dir.fd(), tmp.c_str(), dir.fd(), name.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir.fd(), tmp.c_str(), 0);
    throw_write("cannot write", shown, err);
  }
}

std::string BeneathDir::read_file(const fs::path& rel, uint64_t max_bytes) const {
  const int fd = open_for_read(rel);
  const fs::path shown = path_ / rel;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FileError(shown.string() + ": expected a regular file");
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw FileError("cannot read " + shown.string() + ": " + std::strerror(err));
    }
    if (n == 0) break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      ::close(fd);
      throw FileError(shown.string() + ": more than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::vector<std::pair<std::string, unsigned>> BeneathDir::entries() const {
  std::vector<std::pair<std::string, unsigned>> out;
  const int dup_fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) throw_write("cannot read", path_, errno);
  DIR* d = ::fdopendir(dup_fd);
  if (!d) {
    const int err = errno;
    ::close(dup_fd);
    throw_write("cannot read", path_, err);
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    struct stat st;
    if (::fstatat(fd_, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) out.emplace_back(n, static_cast<unsigned>(st.st_mode));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// Copies regular file `from` (open) into `to` (open, empty) keeping holes: only the data
// extents are copied (copy_file_range, else pread/pwrite), the size is set at the end.
void copy_extents(int from, int to, uint64_t size, const fs::path& shown) {
  std::vector<char> buf;
  auto copy_range = [&](off_t begin, off_t end) {
    off_t in = begin, out = begin;
    while (in < end) {
      const ssize_t n = ::copy_file_range(from, &in, to, &out, static_cast<size_t>(end - in), 0);
      if (n > 0) continue;
      if (n == 0) throw FileError("cannot copy " + shown.string() + ": it ended early (changed while copied?)");
      if (errno == EINTR) continue;
      if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) throw_write("cannot copy", shown, errno);
      buf.resize(1 << 20);   // no copy_file_range here: through a buffer
      while (in < end) {
        const ssize_t r = ::pread(from, buf.data(), std::min<size_t>(buf.size(), static_cast<size_t>(end - in)), in);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw_write("cannot copy", shown, errno);
        if (r == 0) throw FileError("cannot copy " + shown.string() + ": it ended early (changed while copied?)");
        for (ssize_t done = 0; done < r;) {
          const ssize_t w = ::pwrite(to, buf.data() + done, static_cast<size_t>(r - done), in + done);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) throw_write("cannot write the copy of", shown, w < 0 ? errno : EIO);
          done += w;
        }
        in += r;
      }
      return;
    }
  };
  const off_t end = static_cast<off_t>(size);
  for (off_t pos = 0; pos < end;) {
    const off_t data = ::lseek(from, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;   // only a hole is left
      copy_range(pos, end);        // no SEEK_DATA here: everything
      break;
    }
    off_t hole = ::lseek(from, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    copy_range(data, hole);
    pos = hole;
  }
  if (::ftruncate(to, end) != 0) throw_write("cannot write the copy of", shown, errno);
}

}   // namespace

void BeneathDir::copy_tree(const fs::path& from, const fs::path& to) const {
  auto [src_parent, src_name] = parent_of(from);
  auto [dst_parent, dst_name] = parent_of(to);
  const fs::path shown = src_parent.path() / src_name;
  struct stat st;
  if (::fstatat(src_parent.fd(), src_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    throw FileError("cannot copy " + shown.string() + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode)) {
    std::string target(4096, '\0');
    const ssize_t n = ::readlinkat(src_parent.fd(), src_name.c_str(), target.data(), target.size());
    if (n < 0) throw_write("cannot read the link", shown, errno);
    target.resize(static_cast<size_t>(n));
    if (::symlinkat(target.c_str(), dst_parent.fd(), dst_name.c_str()) != 0)
      throw_write("cannot copy", dst_parent.path() / dst_name, errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    if (::mkdirat(dst_parent.fd(), dst_name.c_str(), 0755) != 0)
      throw_write("cannot create", dst_parent.path() / dst_name, errno);
    const BeneathDir src = src_parent.sub(src_name);
    for (const auto& [name, mode] : src.entries()) copy_tree(from / name, to / name);
    return;
  }
  if (!S_ISREG(st.st_mode)) throw FileError("cannot copy " + shown.string() + ": not a regular file, directory or link");
  const int in = ::openat(src_parent.fd(), src_name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (in < 0) throw_write("cannot copy", shown, errno);
  struct stat in_st;
  if (::fstat(in, &in_st) != 0 || !S_ISREG(in_st.st_mode)) {
    ::close(in);
    throw FileError("cannot copy " + shown.string() + ": not a regular file");
  }
  const int out = ::openat(dst_parent.fd(), dst_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                           in_st.st_mode & 07777 & ~07000);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    throw_write("cannot copy to", dst_parent.path() / dst_name, err);
  }
  try {
    copy_extents(in, out, static_cast<uint64_t>(in_st.st_size), shown);
  } catch (...) {
    ::close(in);
    ::close(out);
    throw;
  }
  ::close(in);
  if (::close(out) != 0) throw_write("cannot write the copy of", shown, errno);
}

void BeneathDir::remove_tree(const fs::path& rel) const {
  auto parts = components(rel);
  if (parts.empty()) throw std::logic_error("beneath: remove_tree of the directory itself (" + path_.string() + ")");
  const std::string last = parts.back();
  parts.pop_back();
  fs::path dir;
  for (const auto& p : parts) dir /= p;
  if (mode_of(rel) == 0) return;   // missing (or a missing directory on the way)
  const BeneathDir parent = sub(dir);
  struct stat st;
  if (::fstatat(parent.fd(), last.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISLNK(st.st_mode)) throw SymlinkRefused((parent.path() / last).string());
  remove_entry(parent.fd(), last, parent.path() / last);
}

}   // namespace rh
