// Durable-file helpers for atomic publish (checkpoints, run files): full writes with fsync,
// directory fsync, atomic replace of small files (temp + fsync + rename + fsync dir), atomic
// directory swap, and the name check that keeps manifest-listed files inside their directory.
// A failure of the disk itself throws DiskError (base/text.h); any other throws FileError naming
// the path and the errno text (the checkpoint room raises CheckpointError through
// checkpoint/checked_io.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rh {

// A file operation that failed for a reason other than the disk (DiskError): permissions, a
// missing directory, a name the file system refuses. The message names the path.
struct FileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raises DiskError for a disk errno, else FileError "<what> <path>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& what, const std::string& path);

void write_all(int fd, const void* data, size_t n, const std::string& path);
void fsync_fd(int fd, const std::string& path);
void fsync_dir(const std::string& dir);
// Seconds this process has spent in fsync_fd and fsync_dir so far (all threads), for the
// matrix benchmark's breakdown (base/phases.h).
double fsync_seconds();
// Creates/truncates path with content and fsyncs it (not atomic; for files inside a temp dir).
void write_file_durable(const std::string& path, const std::string& content);
// Replaces path atomically: path.tmp.<pid>, fsync, rename, fsync of the parent directory.
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_small_file(const std::string& path);   // whole file; throws naming it

bool path_exists(const std::string& path);
void remove_tree(const std::string& path);   // rm -r; missing is fine
// Atomically swaps two existing directories (renameat2 RENAME_EXCHANGE). Returns false if the
// file system does not support it (caller falls back); throws on other errors.
bool exchange_dirs(const std::string& a, const std::string& b);
void rename_path(const std::string& from, const std::string& to);

// True for a plain file name: non-empty, no '/', no '\\', no NUL, not "." or "..", not starting
// with '.'. Manifest file names must pass this so a manifest cannot point outside its directory.
bool is_plain_file_name(const std::string& name);

std::string hex_encode(const std::vector<uint8_t>& bytes);
// Throws InputError (base/input.h) naming `what` on odd length or non-hex characters.
std::vector<uint8_t> hex_decode(const std::string& hex, const std::string& what);

}   // namespace rh
