#!/usr/bin/env python3
"""The layers of the code, checked: a room includes only rooms below it (or itself), models/
includes nothing of harness/, and a plain room (reports/, which links no LibTorch) includes only
LibTorch-free headers. The order is CMakeLists.txt's room list (RH_ROOMS, read here), which the
build states as links; docs/layout.md's table lists the same rooms in the same order.

  python3 tests/test_layers.py [TOOL]     (the tool argument CTest passes is ignored)

Exit 0 when every include respects the order, 1 listing each violation (file:line: include)."""
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TORCH_INCLUDE = re.compile(r'#\s*include\s+[<"](torch|ATen|c10)/')


def cmake_rooms():
    """CMakeLists.txt's RH_ROOMS (name:folder[:plain], bottom to top): the folders, the plain ones."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"^set\(RH_ROOMS\s([^)]*)\)", f.read(), re.M)
    entries = [e.split(":") for e in m.group(1).split()]
    return [e[1] for e in entries], {e[1] for e in entries if "plain" in e[2:]}


# Bottom to top. A file in a room may include its own room and any room listed before it.
ROOMS, PLAIN = cmake_rooms()


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
        if room_of(src) in PLAIN:
            with open(os.path.join(ROOT, src), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if TORCH_INCLUDE.match(line.strip()):
                        out.append(f"{src}:{n}: {line.strip()}: the {room_of(src)} room links no LibTorch")
        for n, inc in includes(src):
            target = room_of(inc)
            if target is None:
                if not os.path.exists(os.path.join(ROOT, os.path.dirname(src), inc)):
                    out.append(f"{src}:{n}: {inc} is in no room")
                continue
            if ROOMS.index(target) > mine:
                out.append(f"{src}:{n}: {inc} ({target}) is above {room_of(src)}")
            if room_of(src) in PLAIN and target != room_of(src) and torch_headers(inc):
                out.append(f"{src}:{n}: {inc} pulls in LibTorch, which the {room_of(src)} room does not link")
    return out


class Layers(unittest.TestCase):
    def test_every_room_includes_only_rooms_below_it(self):
        self.assertEqual(violations(), [])

    def test_every_source_file_is_in_a_room(self):
        loose = [f for f in os.listdir(os.path.join(ROOT, "harness")) if f.endswith((".h", ".cpp"))]
        self.assertEqual(loose, [], "harness/ holds rooms only")

    def test_the_room_list_is_docs_layout_table(self):
        with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
            table = re.findall(r"^\| `([^`]+)/` \|", f.read(), re.M)
        self.assertEqual([r for r in table if r in ROOMS], ROOMS)
        self.assertTrue({"harness/base", "reports"} <= PLAIN, "base and reports link no LibTorch")

    def test_the_readme_folder_table_is_the_tree(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            listed = re.findall(r"^\| `([^`]+)/` \|", f.read(), re.M)
        rooms_listed = [r for r in listed if r in ROOMS]
        self.assertEqual(rooms_listed, ROOMS, "the README lists the rooms in the build's order")
        tops = sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")
                      and not d.startswith("build") and d != "runs" and d != "harness")
        rooms_in_harness = sorted("harness/" + d for d in os.listdir(os.path.join(ROOT, "harness")))
        self.assertEqual(sorted(r for r in listed if r.startswith("harness/")), rooms_in_harness)
        self.assertEqual(sorted(r for r in listed if "/" not in r and r != "runs"), tops)

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
