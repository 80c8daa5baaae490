// Shared text helpers; see text.h.
#include "harness/base/text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "harness/base/no_follow.h"

namespace rh {

void write_text(const std::string& path, const std::string& text) {
  // O_NOFOLLOW: a symbolic link planted where the file goes is refused, not written through
  // (issue 32); the link's target is never opened.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP) throw SymlinkRefused(path);
    throw WriteError("cannot write " + path + ": " + std::strerror(errno));
  }
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      throw WriteError("cannot write " + path + ": " + std::strerror(err));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::close(fd) != 0) throw WriteError("cannot write " + path + ": " + std::strerror(errno));
}

void copy_text_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw WriteError("cannot copy " + from + " to " + to + ": cannot read " + from);
  write_text(to, text.str());
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string markup_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') o += ' ';
        else o += c;
    }
  }
  return o;
}

}  // namespace rh
