// Bounded JSON reading, regular-file opening and the checked accessor (see input.h).
#include "harness/base/input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <vector>
#include <stdexcept>

namespace rh {

size_t json_depth_violation(const char* p, size_t n, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

nlohmann::json parse_json_bounded(const char* p, size_t n, const std::string& what,
                                  const nlohmann::json::parser_callback_t& cb) {
  // nlohmann's lexer takes a NUL byte for the end of the input: "{...}\0garbage" would parse.
  if (const void* z = std::memchr(p, '\0', n))
    throw std::invalid_argument(what + ": NUL byte at offset " + std::to_string(static_cast<const char*>(z) - p) +
                                " (not JSON text)");
  if (const size_t at = json_depth_violation(p, n); at != std::string::npos)
    throw std::invalid_argument(what + ": nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels at offset " +
                                std::to_string(at) + " (refused before parsing)");
  try {
    return nlohmann::json::parse(p, p + n, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(what + ": not valid JSON: " + quote_text(e.what(), 2 * kMaxQuoted));
  }
}

nlohmann::json::parser_callback_t unique_keys_callback(std::function<void(const std::string& key)> on_duplicate) {
  // One set of keys per open object; a key seen twice stops the parse at once.
  auto keys = std::make_shared<std::vector<std::set<std::string>>>();
  return [keys, on_duplicate = std::move(on_duplicate)](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys->emplace_back();
    if (ev == E::object_end && !keys->empty()) keys->pop_back();
    if (ev == E::key && !keys->empty() && !keys->back().insert(parsed.get<std::string>()).second)
      on_duplicate(parsed.get<std::string>());
    return true;
  };
}

nlohmann::json parse_json_unique(const char* p, size_t n, const std::string& what) {
  return parse_json_bounded(p, n, what, unique_keys_callback([&what](const std::string& key) {
                              throw std::invalid_argument(
                                  what + ": duplicate key '" + quote_text(key) +
                                  "' in one object (each key may appear once; a parser keeping the last would "
                                  "let an appended edit win unseen)");
                            }));
}

std::string non_ascii_position(const std::string& text) {
  size_t line = 1, col = 1;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (b >= 0x80) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      return std::to_string(line) + ": column " + std::to_string(col) + ": byte " + hex +
             " is not ASCII (TOML files here are ASCII: Debian 12's toml++ 3.3.0 has undefined behaviour on "
             "some non-ASCII characters)";
    }
    if (b == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "";
}

std::string toml_nesting_position(const std::string& text) {
  size_t line = 1, col = 1, i = 0;
  int depth = 0, dots = 0;
  auto at = [&](const std::string& what) {
    return std::to_string(line) + ": column " + std::to_string(col) + ": " + what;
  };
  auto advance = [&] {   // one byte, keeping line and column
    if (text[i] == '\n') ++line, col = 1;
    else ++col;
    ++i;
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"' || c == '\'') {   // a string: skipped whole; it may be a quoted key part
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      for (int k = 0; k < (multi ? 3 : 1); ++k) advance();
      while (i < text.size()) {
        if (c == '"' && text[i] == '\\') {
          advance();
          if (i < text.size()) advance();
          continue;
        }
        if (multi ? text.compare(i, 3, std::string(3, c)) == 0 : text[i] == c) break;
        if (!multi && text[i] == '\n') break;   // unterminated: toml++ reports it
        advance();
      }
      for (int k = 0; k < (multi ? 3 : 1) && i < text.size(); ++k) advance();
      continue;
    }
    if (c == '#') {   // a comment, to the end of the line
      while (i < text.size() && text[i] != '\n') advance();
      continue;
    }
    if (c == '.') {
      if (++dots >= kMaxTomlKeyParts)
        return at("a key or table header of more than " + std::to_string(kMaxTomlKeyParts) +
                  " dotted parts (refused before parsing: the TOML parser recurses on each)");
    } else if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == ' ' || c == '\t' ||
                 c == '+')) {
      dots = 0;   // anything that cannot continue a key (=, comma, brackets, newline) ends it
    }
    if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return at("arrays or tables nested deeper than " + std::to_string(kMaxJsonDepth) +
                  " levels (refused before parsing)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
    advance();
  }
  return "";
}

std::string quote_text(const std::string& s, size_t max) {
  std::string quoted;
  size_t i = 0;
  for (; i < s.size() && quoted.size() < max; ++i) {
    const auto byte = static_cast<unsigned char>(s[i]);
    if (byte < 0x20 || byte == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", byte);
      quoted += buf;
    } else {
      quoted += s[i];
    }
  }
  if (i < s.size()) quoted += "... (" + std::to_string(s.size()) + " bytes)";
  return quoted;
}

namespace {
// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF).
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte_at = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned lead = byte_at(i);
  auto is_continuation = [&](size_t k) { return (byte_at(k) & 0xC0) == 0x80; };
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return is_continuation(i + 1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned second = byte_at(i + 1);
    if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F)) return 0;
    return is_continuation(i + 1) && is_continuation(i + 2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned second = byte_at(i + 1);
    if ((lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) return 0;
    return is_continuation(i + 1) && is_continuation(i + 2) && is_continuation(i + 3) ? 4 : 0;
  }
  return 0;
}
}   // namespace

std::string printable_text(const std::string& s) {
  std::string printable;
  printable.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto byte = static_cast<unsigned char>(s[i]);
    const size_t seq_length = utf8_length(s, i);
    if (seq_length == 0 || ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7f)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", byte);
      printable += buf;
      ++i;
    } else {
      printable.append(s, i, seq_length);
      i += seq_length;
    }
  }
  return printable;
}

std::string dump_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string quote_json(const nlohmann::json& value, size_t max) {
  // Only values from a depth-checked parse reach here, so dump() recursion is bounded.
  return quote_text(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max);
}

namespace {

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw InputError(what + " " + path + ": " + std::strerror(errno));
}

}   // namespace

int open_regular_file(const std::string& path, uint64_t* size, bool no_follow) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (no_follow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    if (no_follow && errno == ELOOP)
      throw InputError(path +
                       ": is a symbolic link; refused (checkpoint files must be regular files "
                       "inside the checkpoint directory)");
    sys_fail("cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    sys_fail("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": is " + std::string(file_type(st.st_mode)) + ", expected a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    sys_fail("cannot clear O_NONBLOCK on", path);
  }
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, bool no_follow) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size, no_follow);
  auto too_big = [&](const std::string& got) {
    ::close(fd);
    throw InputError(path + ": " + got + ", more than the " + std::to_string(max_bytes) + "-byte limit for this file");
  };
  if (size > max_bytes) too_big(std::to_string(size) + " bytes");
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t bytes_read = ::read(fd, buf, sizeof buf);
    if (bytes_read < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      errno = err;
      sys_fail("cannot read", path);
    }
    if (bytes_read == 0) break;
    out.append(buf, static_cast<size_t>(bytes_read));
    if (out.size() > max_bytes) too_big("more bytes than its size said");
  }
  ::close(fd);
  return out;
}

// ---------------------------------------------------------------- JsonField

void JsonField::raise_input_error(const std::string& message) { throw InputError(message); }

void JsonField::raise(const std::string& message) const {
  raise_(message);
  throw InputError(message);   // a Raise that returned
}

void JsonField::fail(const std::string& what) const {
  raise(file_ + ": field " + (path_.empty() ? std::string("(top level)") : path_) + ": " + what);
}

void JsonField::expected(const char* type) const { fail(std::string("expected ") + type + ", got " + quote_json(*j_)); }

JsonField JsonField::operator[](const std::string& key) const {
  if (!j_->is_object()) expected("an object");
  auto it = j_->find(key);
  if (it == j_->end()) raise(file_ + ": field " + path_ + "/" + quote_text(key) + ": missing");
  return JsonField(&*it, file_, path_ + "/" + quote_text(key), raise_);
}

JsonField JsonField::operator[](size_t i) const {
  if (!j_->is_array()) expected("an array");
  if (i >= j_->size())
    fail("has " + std::to_string(j_->size()) + " elements, element " + std::to_string(i) + " is missing");
  return JsonField(&(*j_)[i], file_, path_ + "/" + std::to_string(i), raise_);
}

bool JsonField::has(const std::string& key) const { return j_->is_object() && j_->contains(key); }

size_t JsonField::size() const {
  if (!j_->is_array()) expected("an array");
  return j_->size();
}

size_t JsonField::object_size() const {
  if (!j_->is_object()) expected("an object");
  return j_->size();
}

void JsonField::each(const std::function<void(const JsonField&)>& fn) const {
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) fn((*this)[i]);
}

void JsonField::each_member(const std::function<void(const std::string&, const JsonField&)>& fn) const {
  if (!j_->is_object()) expected("an object");
  for (auto it = j_->begin(); it != j_->end(); ++it)
    fn(it.key(), JsonField(&it.value(), file_, path_ + "/" + quote_text(it.key()), raise_));
}

std::string JsonField::str() const {
  if (!j_->is_string()) expected("a string");
  return j_->get<std::string>();
}

bool JsonField::boolean() const {
  if (!j_->is_boolean()) expected("true or false");
  return j_->get<bool>();
}

double JsonField::number() const {
  if (!j_->is_number()) expected("a number");
  return j_->get<double>();
}

int64_t JsonField::i64(int64_t lo, int64_t hi) const {
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!j_->is_number_integer()) expected(range.c_str());
  if (j_->is_number_unsigned() && j_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) expected(range.c_str());
  const int64_t v = j_->get<int64_t>();
  if (v < lo || v > hi) expected(range.c_str());
  return v;
}

uint64_t JsonField::u64(uint64_t hi) const {
  const std::string range = "an integer in [0, " + std::to_string(hi) + "]";
  if (!j_->is_number_unsigned()) expected(range.c_str());
  const uint64_t v = j_->get<uint64_t>();
  if (v > hi) expected(range.c_str());
  return v;
}

}   // namespace rh
