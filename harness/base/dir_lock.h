// One run at a time in a directory: an exclusive flock on <dir>/.lock, held for the object's life
// (and released by the kernel however the process ends, so a killed run leaves no stale lock).
// `matrix` and `check` take it on their run directory: two runs into one directory removed each
// other's baselines and both exited 0.
#pragma once
#include <filesystem>
#include <stdexcept>

namespace rh {

// "<dir> is in use by another run (process N, <dir>/.lock); wait for it to end or give another
// run directory". A runtime_error: the tool exits 2 on it.
struct DirBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class DirLock {
 public:
  // Creates dir (and its parents) when missing; throws DirBusy when another process holds the
  // lock, FileError (base/fsutil.h) when the lock file cannot be made, SymlinkRefused when it is a
  // link. Never waits.
  explicit DirLock(const std::filesystem::path& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}   // namespace rh
