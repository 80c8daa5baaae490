"""python3 -m rhckpt: list or check resume-harness checkpoints.

    python3 -m rhckpt CKPT [CKPT ...]     verify, list every tensor, totals per key kind and dtype
    python3 -m rhckpt --max-decoded BYTES CKPT ...
                                          the same, refusing (before decoding) checkpoints whose
                                          compressed files would decode to more than BYTES
    python3 -m rhckpt --expect FILE.json  compare every tensor with values the tool reported
                                          (tests/checkpoint/test_checkpoint_python.cpp writes FILE.json)

Exit status as `resume-harness inspect`: 0 intact (and matching), 1 damaged or different, 2 bad input.
Every refusal is one line on stderr naming the file and the field or tensor, never a traceback; an
error this reader did not foresee is reported in one line as an internal error, exit 3 (a bug:
tests/test_rhckpt_fuzz.py fails on it).
"""
import sys
from collections import defaultdict

import numpy as np

from . import BadInput, Damaged, NoTensor, decode
from . import open as open_checkpoint
from .guard import Field, parse_json_bounded, read_regular_file

KINDS = ("master_param", "remainder", "exp_avg_sq", "exp_avg")


def kind_of(file, key):
    if file == "model.safetensors":
        return "model"
    tail = key.split("/", 1)[1] if "/" in key else key
    if tail.endswith(".scale") or tail.endswith(".scale_inv"):
        return "scale"
    return next((k for k in KINDS if tail.startswith(k)), "other")


def list_checkpoint(path, out, max_decoded=None):
    ck = open_checkpoint(path, max_decoded)
    totals = defaultdict(int)
    for f, key, dt, shape, nbytes in ck.tensor_rows():
        print("%-30s %-48s %-8s %-14s %10d" % (f, key, dt, shape, nbytes), file=out)
        totals[(kind_of(f, key), dt)] += nbytes
    for (kind, dt), n in sorted(totals.items()):
        print("total %-14s %-8s %12d bytes" % (kind, dt, n), file=out)
    stored, raw = sum(ck.stored_bytes.values()), sum(ck.raw_bytes.values())
    print("rhckpt: %s: %d tensors in %d files verified, %d bytes on disk (%d raw)"
          % (ck.dir, len(ck.tensor_rows()), len(ck.files()), stored, raw), file=out)


def as_floats(values):
    return np.array([float(v) for v in values], dtype=np.float64)


def check_expected(spec):
    """Every listed tensor equal bit for bit (NaN = NaN) to the tool's values; scaled fp16/fp8
    states also unscaled as TransformerEngine decodes them."""
    checked = 0
    for c in spec["checkpoints"].each():   # spec: a Field, so a missing key names file and field
        c["dir"].str()
        for ef in c["tensors"].each():   # every entry's fields first: a missing one is named
            ef["file"].str(), ef["key"].str(), ef["dtype"].str(), ef["shape"].size(), ef["values"].size()
        ck = open_checkpoint(c["dir"].str())
        rows = ck.tensor_rows()
        if len(rows) != c["tensors"].size():
            raise Damaged(c["dir"].v, "%d tensors on disk, %d expected" % (len(rows), c["tensors"].size()))
        pieces = {(f, k): (dt, a) for f, k, dt, a in
                  ((p[0], key, p[1], p[2]) for key in ck.keys() for p in ck.pieces(key))}
        for ef in c["tensors"].each():
            e = ef.v
            if (e["file"], e["key"]) not in pieces:
                ef["key"].fail("no tensor '%s' in %s of %s" % (e["key"], e["file"], c["dir"].v))
            dt, raw = pieces[(e["file"], e["key"])]
            got = decode(dt, raw).astype(np.float64).reshape(-1)
            if dt != e["dtype"] or list(raw.shape) != e["shape"] or not np.array_equal(got, as_floats(e["values"]),
                                                                                        equal_nan=True):
                raise Damaged(c["dir"].v + "/" + e["file"], "tensor '%s' (%s) does not match the tool" % (e["key"], dt))
            if "unscaled" in e:
                mult = e["key"] + (".scale_inv" if dt == "F8_E4M3" else ".scale")
                if (e["file"], mult) not in pieces:
                    ef["unscaled"].fail("%s has no tensor '%s' to unscale with" % (e["file"], mult))
                scale = decode(*pieces[(e["file"], mult)]).astype(np.float32).reshape(())
                value = (got.astype(np.float32) * scale).astype(np.float64)
                if not np.array_equal(value, as_floats(e["unscaled"]), equal_nan=True):
                    raise Damaged(c["dir"].v + "/" + e["file"], "tensor '%s' unscaled values differ" % e["key"])
            checked += 1
    return checked


def main(argv):
    try:
        if len(argv) == 2 and argv[0] == "--expect":
            try:
                spec = Field(parse_json_bounded(read_regular_file(argv[1], 1 << 30, no_follow=False), argv[1]), argv[1])
                spec["checkpoints"].size()
            except Damaged as e:
                raise BadInput(str(e)) from None
            print("rhckpt: %d tensors match the tool" % check_expected(spec))
            return 0
        if argv and argv[0] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        max_decoded = None
        if len(argv) >= 2 and argv[0] == "--max-decoded":
            if not argv[1].isdigit():
                raise BadInput("--max-decoded: expected a number of bytes, got '%s'" % argv[1])
            max_decoded, argv = int(argv[1]), argv[2:]
        if not argv or argv[0].startswith("-"):
            print(__doc__.strip(), file=sys.stderr)
            return 2
        for path in argv:
            list_checkpoint(path, sys.stdout, max_decoded)
        return 0
    except BadInput as e:
        print("rhckpt: error: %s" % one_line(e), file=sys.stderr)
        return 2
    except NoTensor as e:
        print("rhckpt: error: %s" % one_line(e.args[0]), file=sys.stderr)
        return 1
    except (Damaged, ValueError) as e:
        print("rhckpt: error: %s" % one_line(e), file=sys.stderr)
        return 1
    except OSError as e:
        print("rhckpt: error: %s" % one_line(e), file=sys.stderr)
        return 2
    except Exception as e:   # noqa: BLE001 (one line instead of a traceback; exit 3 marks a reader bug)
        print("rhckpt: internal error: %s: %s" % (type(e).__name__, one_line(e)), file=sys.stderr)
        return 3


def one_line(e):
    """The message of e on one line (a hostile value may hold newlines), a path's bytes that are not
    UTF-8 as \\xNN, as the tool prints them (printable_text in harness/base/input.h)."""
    text = str(e).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n")


def console_main():
    """Entry point of the `rhckpt` console script (pyproject.toml)."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    console_main()
