"""Reading files and JSON that arrive from outside without trusting them, as the tool's
harness/base/input.h does: regular files only (never through a symbolic link), a size
cap checked before reading, JSON nesting bounded before the parser (which recurses) sees the text,
and one checked accessor (Field) that names the file, the JSON path and the expected type.
Every refusal is Damaged(path, "field /json/path: expected ..., got ...").
"""
import json
import os
import stat

from .errors import Damaged

MAX_JSON_DEPTH = 64    # kMaxJsonDepth: our own files nest at most 6 levels
MAX_QUOTED = 200       # kMaxQuoted: characters of a hostile value quoted in a message


def quote(v):
    """A value or string for a message: compact JSON, cut to MAX_QUOTED characters."""
    s = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)[:MAX_QUOTED + 1]
    s = s.encode("unicode_escape", "backslashreplace").decode("ascii") if any(ord(c) < 32 for c in s) else s
    return s if len(s) <= MAX_QUOTED else s[:MAX_QUOTED] + "... (%d characters)" % len(s)


def depth_violation(text, max_depth=MAX_JSON_DEPTH):
    """Offset of the first '[' or '{' outside strings that opens level max_depth + 1, else -1."""
    depth, in_str, esc = 0, False, False
    for i, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > max_depth:
                return i
        elif c in "]}":
            depth -= 1
    return -1


def parse_json_bounded(data, path, what="", unique_keys=False):
    """One JSON value from bytes or str: no NUL, nesting bounded, strict (NaN refused); with
    unique_keys, a key named twice in one object is refused (the manifest, as the tool does)."""
    where = path + (" " + what if what else "")
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise Damaged(where, "not valid JSON: not UTF-8 at byte %d" % e.start) from None
    if "\0" in data:
        raise Damaged(where, "NUL byte at offset %d" % data.index("\0"))
    at = depth_violation(data)
    if at >= 0:
        raise Damaged(where, "nesting deeper than %d levels at offset %d" % (MAX_JSON_DEPTH, at))

    def no_constants(name):
        raise ValueError("%s is not JSON" % name)
    dup = []

    def unique(pairs):   # a key named twice is refused (json keeps the last silently)
        seen = set()
        for k, _ in pairs:
            if k in seen and not dup:
                dup.append(k)
            seen.add(k)
        return dict(pairs)
    try:
        value = json.loads(data, parse_constant=no_constants, object_pairs_hook=unique)
    except (ValueError, RecursionError) as e:
        raise Damaged(where, "not valid JSON: %s" % quote(str(e))) from None
    if dup and unique_keys:
        raise Damaged(where, "duplicate key '%s' in one object (each key may appear once)" % quote(dup[0]))
    return value


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path, max_bytes, no_follow=True):
    """The bytes of a regular file of at most max_bytes (checked before reading; a FIFO cannot hang
    the open); with no_follow a symbolic link is refused, so nothing outside the directory is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (os.O_NOFOLLOW if no_follow else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if no_follow and os.path.islink(path):
            raise Damaged(path, "is a symbolic link; refused (checkpoint files must be regular files inside "
                                "the checkpoint directory)") from None
        raise Damaged(path, "cannot open: %s" % e.strerror) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Damaged(path, "is %s, expected a regular file" % _kind(st.st_mode))
        if st.st_size > max_bytes:
            raise Damaged(path, "%d bytes, more than the %d-byte limit for this file" % (st.st_size, max_bytes))
        chunks, left = [], st.st_size + 1   # one byte more: a file that grew is refused, not cut
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise Damaged(path, "more than the %d-byte limit for this file" % max_bytes)
        return data
    finally:
        os.close(fd)


class Field:
    """A checked view of one JSON value in a file (JsonField in harness/base/input.h)."""

    def __init__(self, value, file, path=""):
        self.v, self.file, self.path = value, file, path

    def fail(self, what):
        raise Damaged(self.file, "field %s: %s" % (self.path or "(top level)", what))

    def expected(self, what):
        self.fail("expected %s, got %s" % (what, quote(self.v)))

    def __getitem__(self, key):
        if isinstance(key, int):
            if not isinstance(self.v, list):
                self.expected("an array")
            if key >= len(self.v):
                self.fail("has %d elements, element %d is missing" % (len(self.v), key))
            return Field(self.v[key], self.file, "%s/%d" % (self.path, key))
        if not isinstance(self.v, dict):
            self.expected("an object")
        if key not in self.v:
            raise Damaged(self.file, "field %s/%s: missing" % (self.path, quote(key)))
        return Field(self.v[key], self.file, "%s/%s" % (self.path, quote(key)))

    def has(self, key):
        return isinstance(self.v, dict) and key in self.v

    def size(self):
        if not isinstance(self.v, list):
            self.expected("an array")
        return len(self.v)

    def each(self):
        return [self[i] for i in range(self.size())]

    def members(self):
        if not isinstance(self.v, dict):
            self.expected("an object")
        return [(k, Field(v, self.file, "%s/%s" % (self.path, quote(k)))) for k, v in self.v.items()]

    def str(self):
        if not isinstance(self.v, str):
            self.expected("a string")
        return self.v

    def boolean(self):
        if not isinstance(self.v, bool):
            self.expected("true or false")
        return self.v

    def number(self):
        if isinstance(self.v, bool) or not isinstance(self.v, (int, float)):
            self.expected("a number")
        return float(self.v)

    def i64(self, lo=-(1 << 63), hi=(1 << 63) - 1):
        if isinstance(self.v, bool) or not isinstance(self.v, int) or not lo <= self.v <= hi:
            self.expected("an integer in [%d, %d]" % (lo, hi))
        return self.v

    def u64(self, hi=(1 << 64) - 1):
        if isinstance(self.v, bool) or not isinstance(self.v, int) or not 0 <= self.v <= hi:
            self.expected("an integer in [0, %d]" % hi)
        return self.v
