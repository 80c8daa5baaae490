#!/usr/bin/env python3
"""The layers of the code, checked: a room includes only rooms below it (or itself), models/
includes nothing of harness/, and the LibTorch-free rooms (base/, process/, reports/) include
no LibTorch header, directly or through another room's header. The order is docs/layout.md's
table and CMakeLists.txt's room list.

  python3 tests/test_layers.py [TOOL]     (the tool argument CTest passes is ignored)

Exit 0 when every include respects the order, 1 listing each violation (file:line: include)."""
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bottom to top. A file in a room may include its own room and any room listed before it.
ROOMS = ["harness/base", "harness/process", "models", "harness/optim", "harness/checkpoint", "harness/ranks",
         "harness/train", "harness/verify", "reports", "harness/cli"]
# Rooms that use no LibTorch: the reports room does not link it, base/ and process/ are what the
# reports room and the fuzz targets build on.
NO_TORCH = ["harness/base", "harness/process", "reports"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TORCH_INCLUDE = re.compile(r'#\s*include\s+[<"](torch|ATen|c10)/')


def room_of(path):
    """The room a repository path belongs to (the longest matching prefix), or None."""
    best = None
    for r in ROOMS:
        if path == r or path.startswith(r + "/"):
            if best is None or len(r) > len(best):
                best = r
    return best


def includes(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1)


def sources():
    for r in ROOMS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, r)):
            for name in sorted(files):
                if name.endswith((".h", ".cpp")):
                    p = os.path.relpath(os.path.join(dirpath, name), ROOT)
                    if room_of(p) == r:
                        yield p


def torch_headers(path, seen=None):
    """True if `path` (a repository header) pulls in LibTorch, directly or through our headers."""
    seen = set() if seen is None else seen
    if path in seen:
        return False
    seen.add(path)
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    if TORCH_INCLUDE.search(text):
        return True
    return any(os.path.exists(os.path.join(ROOT, inc)) and torch_headers(inc, seen) for _, inc in includes(path))


def violations():
    out = []
    for src in sources():
        mine = ROOMS.index(room_of(src))
        if room_of(src) in NO_TORCH:
            with open(os.path.join(ROOT, src), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if TORCH_INCLUDE.match(line.strip()):
                        out.append(f"{src}:{n}: {line.strip()}: {room_of(src)} uses no LibTorch")
        for n, inc in includes(src):
            target = room_of(inc)
            if target is None:
                if not os.path.exists(os.path.join(ROOT, os.path.dirname(src), inc)):
                    out.append(f"{src}:{n}: {inc} is in no room")
                continue
            if ROOMS.index(target) > mine:
                out.append(f"{src}:{n}: {inc} ({target}) is above {room_of(src)}")
            if room_of(src) in NO_TORCH and target not in NO_TORCH and torch_headers(inc):
                out.append(f"{src}:{n}: {inc} pulls in LibTorch, which {room_of(src)} does not use")
    return out


class Layers(unittest.TestCase):
    def test_every_room_includes_only_rooms_below_it(self):
        self.assertEqual(violations(), [])

    def test_every_source_file_is_in_a_room(self):
        loose = [f for f in os.listdir(os.path.join(ROOT, "harness")) if f.endswith((".h", ".cpp"))]
        self.assertEqual(loose, [], "harness/ holds rooms only")

    def test_the_check_catches_an_upward_include(self):
        # Negative control: a models/ file including the checkpoint room must be reported.
        global includes
        real = includes

        def fake(path):
            yield from real(path)
            if path == "models/model.h":
                yield 999, "harness/checkpoint/checkpoint.h"
        includes = fake
        try:
            self.assertTrue(any("models/model.h:999" in v for v in violations()))
        finally:
            includes = real


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
