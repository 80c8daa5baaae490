// Small text helpers every room shares: writing a whole file, quoting a CSV field, escaping for
// XML and HTML. LibTorch-free (the reports room uses them).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace rh {

// Raised when a file cannot be written; the message names the path.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The machine's storage failed, not the input: no space (ENOSPC), over quota (EDQUOT), an I/O
// error (EIO) or a read-only filesystem (EROFS). The tool exits 4 on it (README, exit codes), not 2
// ("bad input"): a disk-full save used to say 2. The message names the path and says it is the
// disk; it carries kDiskErrorTag, so it keeps its exit code after being passed between ranks as
// text (a data-parallel save agrees on errors as strings).
constexpr const char* kDiskErrorTag = "(the disk failed, not the input)";
struct DiskError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
bool is_disk_errno(int err);
// "<what> <path>: <strerror(err)> (the disk failed, not the input)"; a hint for ENOSPC/EDQUOT.
std::string disk_error_text(const std::string& what, const std::string& path, int err);
// Throws DiskError when err is a disk errno; returns otherwise.
void throw_if_disk_errno(const std::string& what, const std::string& path, int err);
// Whether a message is (or wraps) a DiskError's.
bool is_disk_error_message(const std::string& message);

// Writes `text` to `path` (created or truncated, binary). Throws WriteError "cannot write PATH: why",
// or SymlinkRefused (no_follow.h) when `path` is a symbolic link: it is never written through.
void write_text(const std::string& path, const std::string& text);

// Copies a (small) file by reading it whole and writing it with write_text: the destination is
// never a followed link. Throws WriteError naming the path that failed.
void copy_text_file(const std::string& from, const std::string& to);

// A CSV field as RFC 4180 writes it: quoted (and '"' doubled) only when it holds ',', '"' or a
// line break.
std::string csv_field(const std::string& s);

// The records of an RFC 4180 CSV text, the reader csv_field is written for: fields split at
// commas; a quoted field may hold commas, doubled quotes and line breaks (a failure text with a
// newline once broke summary.csv for the line-based reader); CRLF or LF ends a record; spaces
// around an unquoted field are trimmed; empty lines are skipped. `line` is where a record starts
// (1-based). A quote left open, or text after a closing quote, throws std::invalid_argument
// "LINE: <why>" (to follow "path:").
struct CsvRecord {
  unsigned line;
  std::vector<std::string> fields;
};
std::vector<CsvRecord> csv_parse(const std::string& text);

// Text for XML or HTML content and attribute values: & < > " ' escaped; control characters other
// than tab and newline (which XML 1.0 forbids) become spaces.
std::string markup_escape(const std::string& s);

}   // namespace rh
