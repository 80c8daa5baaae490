// Small text helpers every room shares: writing a whole file, quoting a CSV field, escaping for
// XML and HTML. LibTorch-free (the reports room uses them).
#pragma once
#include <stdexcept>
#include <string>

namespace rh {

// Raised when a file cannot be written; the message names the path.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes `text` to `path` (created or truncated, binary). Throws WriteError "cannot write PATH: why",
// or SymlinkRefused (no_follow.h) when `path` is a symbolic link: it is never written through.
void write_text(const std::string& path, const std::string& text);

// Copies a (small) file by reading it whole and writing it with write_text: the destination is
// never a followed link. Throws WriteError naming the path that failed.
void copy_text_file(const std::string& from, const std::string& to);

// A CSV field as RFC 4180 writes it: quoted (and '"' doubled) only when it holds ',', '"' or a
// line break.
std::string csv_field(const std::string& s);

// Text for XML or HTML content and attribute values: & < > " ' escaped; control characters other
// than tab and newline (which XML 1.0 forbids) become spaces.
std::string markup_escape(const std::string& s);

}  // namespace rh
