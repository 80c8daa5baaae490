#!/usr/bin/python3
"""The conformance corpus (tests/conformance) against python/rhckpt: every case gets the
verdict the corpus names (exit 0, 1 or 2 of `python3 -m rhckpt`, and a message holding the expected
substring), on one line without a traceback. tests/checkpoint/test_checkpoint_conformance.cpp holds the tool's
own reader to the same table, so the two readers cannot drift apart. The zstd bomb is also held to
a memory bound: it must be refused before anything is decoded.

Usage: test_rhckpt_conformance.py [PATH_TO_resume-harness]   (CTest passes it; unused here)
"""
import contextlib
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "python")
sys.path.insert(0, PYTHON_DIR)
from rhckpt.__main__ import main  # noqa: E402

CORPUS = None   # a temporary directory the generator filled


def load_expected(corpus):
    rows = []
    with open(os.path.join(corpus, "expected.tsv")) as f:
        for line in f:
            name, code, rule, reason = line.rstrip("\n").split("\t")
            rows.append((name, int(code), rule, reason))
    return rows


class Conformance(unittest.TestCase):
    def test_every_case_gets_its_verdict(self):
        rows = load_expected(CORPUS)
        self.assertGreaterEqual(len(rows), 60)
        wrong = []
        for name, code, rule, reason in rows:
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                got = main([os.path.join(CORPUS, name)])
            msg = err.getvalue()
            lines = msg.strip().splitlines()
            if got != code or reason not in msg or (code != 0 and len(lines) != 1) or "Traceback" in msg:
                wrong.append("%s (%s): expected exit %d and '%s', got exit %d: %s" % (name, rule, code, reason, got, msg.strip()))
        self.assertEqual(wrong, [], "\n".join(wrong))

    def test_refusals_name_the_file(self):
        for name, code, _, _ in load_expected(CORPUS):
            if code != 1:
                continue
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                main([os.path.join(CORPUS, name)])
            self.assertIn(os.path.join(CORPUS, name), err.getvalue(), name)

    def refused_before_decoding(self, case, max_rss_kb):
        """rhckpt on the corpus case `case` in a child: exit 1, "refused before decoding", and a
        peak RSS (KB) below max_rss_kb."""
        code = ("import resource, sys; sys.path.insert(0, %r); from rhckpt.__main__ import main; "
                "rc = main([%r]); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
                % (PYTHON_DIR, os.path.join(CORPUS, case)))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("refused before decoding", p.stderr)
        self.assertLess(int(p.stdout.strip()), max_rss_kb, "peak RSS in KB")

    def test_bomb_is_refused_before_decoding(self):
        """256 MiB of zeros in ~13 KB of zstd frames, under a table the manifest does not list:
        the child's peak RSS stays far below the bomb (the old reader reached 561 MB)."""
        self.refused_before_decoding("zstd_bomb_256mib", 128 * 1024)

    def test_bomb_the_manifest_agrees_with_is_refused_before_decoding(self):
        """64 MiB of zeros whose manifest entry was resealed to agree with the table: the manifest's
        own shard range refuses it before decoding (the old reader decoded it: 2.34 s, 166 MB)."""
        self.refused_before_decoding("zstd_bomb_manifest_agrees", 64 * 1024)

    def test_max_decoded_caps_what_a_checkpoint_may_decode(self):
        """The caller's budget (the tool's load passes what its model can hold): refused before
        decoding naming both numbers, accepted at exactly the manifest's total."""
        base = os.path.join(HERE, "conformance", "base", "zstd_dp2")
        for limit, code in (("13103", 1), ("13104", 0)):
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                got = main(["--max-decoded", limit, base])
            self.assertEqual(got, code, err.getvalue())
        self.assertIn("need 13104 bytes decoded, more than the 13103 bytes allowed",
                      self._stderr_of(["--max-decoded", "13103", base]))
        self.assertEqual(main(["--max-decoded", "lots", base]), 2)

    def _stderr_of(self, argv):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main(argv)
        return err.getvalue()

    def test_expect_file_missing_fields_are_named(self):
        """--expect FILE with a missing key names the file and the field (it printed "error: 'dir'")."""
        d = tempfile.mkdtemp(prefix="rh_expect_")
        try:
            base = os.path.join(HERE, "conformance", "base", "plain_dp2")
            for text, want in (('{"checkpoints": [{}]}', "field /checkpoints/0/dir: missing"),
                               ('{"checkpoints": 3}', "field /checkpoints: expected an array"),
                               ('{"checkpoints": [{"dir": "%s", "tensors": [{"file": "model.safetensors"}]}]}' % base,
                                "field /checkpoints/0/tensors/0/key: missing")):
                spec = os.path.join(d, "spec.json")
                with open(spec, "w") as f:
                    f.write(text)
                msg = self._stderr_of(["--expect", spec])
                self.assertIn(spec, msg)
                self.assertIn(want, msg)
                self.assertEqual(len(msg.strip().splitlines()), 1, msg)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_paths_that_are_not_utf8_are_printed_as_the_tool_prints_them(self):
        """A checkpoint path with bytes that are not UTF-8: opened, and named with \\xNN in a refusal."""
        d = tempfile.mkdtemp(prefix="rh_utf8_")
        try:
            odd = os.path.join(os.fsencode(d), b"ckpt_\xff\xfe")
            shutil.copytree(os.path.join(HERE, "conformance", "base", "plain_dp2"), os.fsdecode(odd))
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(main([os.fsdecode(odd)]), 0)
            os.remove(os.path.join(odd, b"manifest.json.xxh3"))
            msg = self._stderr_of([os.fsdecode(odd)])
            self.assertIn("ckpt_\\xff\\xfe/manifest.json.xxh3: missing", msg)
            msg.encode("utf-8")   # printable: no lone surrogates
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_command_line_prints_one_line(self):
        """The module as users run it: one line on stderr, the tool's exit code, no traceback."""
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        for name, code in (("schema_files_not_a_list", 1), ("manifest_nested_100000", 1), ("no_such_path", 2)):
            p = subprocess.run([sys.executable, "-m", "rhckpt", os.path.join(CORPUS, name)], env=env,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, code, p.stderr)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            self.assertNotIn("Traceback", p.stderr)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    CORPUS = tempfile.mkdtemp(prefix="rh_conformance_")
    try:
        subprocess.run([sys.executable, os.path.join(HERE, "conformance", "make_corpus.py"), CORPUS], check=True)
        ok = unittest.main(argv=sys.argv[:1], exit=False).result.wasSuccessful()
    finally:
        shutil.rmtree(CORPUS, ignore_errors=True)
    sys.exit(0 if ok else 1)
