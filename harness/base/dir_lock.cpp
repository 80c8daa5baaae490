// The run directory's lock; see dir_lock.h.
#include "harness/base/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "harness/base/fsutil.h"
#include "harness/base/no_follow.h"

namespace fs = std::filesystem;

namespace rh {

DirLock::DirLock(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path file = dir / ".lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    if (errno == ELOOP) throw SymlinkRefused(file.string());
    throw_errno("cannot create the lock file", file.string());
  }
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    std::string holder;
    char buf[32] = {};
    if (err == EWOULDBLOCK) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) holder += buf[i];
    }
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      errno = err;
      throw_errno("cannot lock", file.string());
    }
    throw DirBusy(dir.string() + " is in use by another run (" + (holder.empty() ? "" : "process " + holder + ", ") +
                  file.string() + "); wait for it to end or give another run directory");
  }
  // Who holds it, for the message a second run prints (informative only: the flock decides).
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}   // namespace rh
