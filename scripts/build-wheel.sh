#!/usr/bin/env bash
# Builds rhckpt's wheel from a copy of python/ (a build in place would write build/ and
# rhckpt.egg-info into the source, or into an install prefix), with only the system's setuptools
# and wheel (no package index): scripts/build-wheel.sh SRC_DIR OUT_DIR. CMake runs it (target
# rhckpt_wheel) and installs the wheel beside the package's sources.
set -euo pipefail
src=$1 out=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/python" "$out"
(cd "$src" && tar --exclude=__pycache__ --exclude=build --exclude='*.egg-info' -cf - .) | (cd "$tmp/python" && tar -xf -)
/usr/bin/python3 -m pip wheel --quiet --no-build-isolation --no-index --no-deps -w "$tmp/dist" "$tmp/python" \
  > "$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
wheel=$(ls "$tmp"/dist/rhckpt-*.whl)
mv -f "$wheel" "$out/"
