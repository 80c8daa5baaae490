// Shared text helpers; see text.h.
#include "harness/base/text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "harness/base/no_follow.h"

namespace rh {

bool is_disk_errno(int err) { return err == ENOSPC || err == EDQUOT || err == EIO || err == EROFS; }

std::string disk_error_text(const std::string& what, const std::string& path, int err) {
  std::string hint;
  if (err == ENOSPC || err == EDQUOT) hint = "; free space on the filesystem holding it and run again";
  return what + " " + path + ": " + std::strerror(err) + " " + kDiskErrorTag + hint;
}

void throw_if_disk_errno(const std::string& what, const std::string& path, int err) {
  if (is_disk_errno(err)) throw DiskError(disk_error_text(what, path, err));
}

bool is_disk_error_message(const std::string& message) { return message.find(kDiskErrorTag) != std::string::npos; }

void write_text(const std::string& path, const std::string& text) {
  // O_NOFOLLOW: a symbolic link planted where the file goes is refused, not written through;
  // the link's target is never opened.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP) throw SymlinkRefused(path);
    throw_if_disk_errno("cannot write", path, errno);
    throw WriteError("cannot write " + path + ": " + std::strerror(errno));
  }
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t written = ::write(fd, p, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int err = errno;
      ::close(fd);
      throw_if_disk_errno("cannot write", path, err);
      throw WriteError("cannot write " + path + ": " + std::strerror(err));
    }
    p += written;
    left -= static_cast<size_t>(written);
  }
  if (::close(fd) != 0) {
    throw_if_disk_errno("cannot write", path, errno);
    throw WriteError("cannot write " + path + ": " + std::strerror(errno));
  }
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
  std::string quoted = "\"";
  for (char c : s) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::vector<CsvRecord> csv_parse(const std::string& text) {
  std::vector<CsvRecord> records;
  unsigned line = 1;
  size_t i = 0;
  const size_t n = text.size();
  auto trim = [](std::string field) {
    field.erase(0, field.find_first_not_of(' '));
    field.erase(field.find_last_not_of(' ') + 1);
    return field;
  };
  while (i < n) {
    if (text[i] == '\n' || (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n')) {   // an empty line
      i += text[i] == '\r' ? 2 : 1;
      ++line;
      continue;
    }
    CsvRecord rec{line, {}};
    for (;;) {   // one field per pass
      std::string field;
      size_t j = i;
      while (j < n && text[j] == ' ') ++j;
      if (j < n && text[j] == '"') {
        const unsigned opened = line;
        for (i = j + 1;; ++i) {
          if (i >= n) throw std::invalid_argument(std::to_string(opened) + ": a quoted field is not closed");
          if (text[i] == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              ++i;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          field += text[i];
        }
        while (i < n && text[i] == ' ') ++i;
        if (i < n && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && i + 1 < n && text[i + 1] == '\n'))
          throw std::invalid_argument(std::to_string(line) + ": text after a closing quote");
      } else {
        const size_t end = text.find_first_of(",\n", i);
        field = text.substr(i, (end == std::string::npos ? n : end) - i);
        i = end == std::string::npos ? n : end;
        if (!field.empty() && field.back() == '\r' && (i == n || text[i] == '\n')) field.pop_back();
        field = trim(field);
      }
      rec.fields.push_back(std::move(field));
      if (i < n && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < n && text[i] == '\r') ++i;
      if (i < n && text[i] == '\n') {
        ++i;
        ++line;
      }
      break;
    }
    records.push_back(std::move(rec));
  }
  return records;
}

std::string markup_escape(const std::string& s) {
  std::string escaped;
  escaped.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') escaped += ' ';
        else escaped += c;
    }
  }
  return escaped;
}

}   // namespace rh
