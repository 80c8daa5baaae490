#!/usr/bin/python3
"""Every example in the docs that a reader would run, run: each shell command in a fenced block of
README.md, docs/*.md, scenarios/README.md and examples/*/README.md that invokes `resume-harness`
(build/resume-harness, torchrun ... resume-harness) or a `scripts/*.sh`, and each scenario file
shown there (a TOML block with `[[scenario]]`, `[[matrix]]` or `[defaults]`), is in EXAMPLES below
with what this test does with it:

  run    run as written (a scenario file: written to a file and checked with the command given),
         against the tool under test, and its exit code must be the one the text says (0 unless
         the example shows a failure); `output` must appear in what it prints;
  list   run with `--list` instead (the scenario names and the file resolve, nothing trains),
         where running it costs more than CI can pay and another example or test runs the path;
  same   a copy of another example (parsed: the same TOML data), which is run;
  skip   not run, with the reason.

A command or scenario file in the docs that is not in EXAMPLES fails the test (run it, or say
why not), and so does an entry no document holds any more. A YAML block that runs the tool fails
too: CI recipes are files under examples/ci/, which tests/test_ci_recipes.py runs.

Commands run in one temporary directory, in EXAMPLES' order, that looks like the repository root
(a link to each of its top-level entries) with `build` a link to the directory of the tool under
test and an empty `runs/`, so everything an example writes (runs/check, ckpt, run1, ...) lands
there; PATH starts with /usr/bin, so `python3` is Debian's (with torch), as on the Debian 12
machine the docs are written for.

  /usr/bin/python3 tests/test_docs_examples.py PATH_TO_resume-harness     (CTest passes it)"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = None
INVOKES = re.compile(r"(?<![\w-])(build/)?resume-harness\s|scripts/[\w-]+\.sh")
SCENARIO_TOML = re.compile(r"^\s*\[(\[scenario\]|\[matrix\]|defaults)\]", re.M)


def doc_files():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
        [os.path.join(ROOT, "scenarios", "README.md")] + \
        sorted(glob.glob(os.path.join(ROOT, "examples", "*", "README.md")))
    return [os.path.relpath(f, ROOT) for f in files]


def fenced_blocks(path):
    """(language, first line number, text) of each fenced block."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```\s*([\w-]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        yield m.group(1), i + 2, "\n".join(lines[i + 1:j])
        i = j + 1


def strip_comment(line):
    """The line without a trailing `# comment` outside quotes."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip()
    return line.rstrip()


def shell_commands(text):
    """The commands of a shell block: comments dropped, `\\` continuations joined, spaces collapsed."""
    out, cur = [], ""
    for line in text.split("\n"):
        line = strip_comment(line)
        if not line.strip():
            continue
        cur += line.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip() + " "
            continue
        out.append(re.sub(r"\s+", " ", cur))
        cur = ""
    return out


def first_line(text):
    """A block's key: its first non-empty line, spaces collapsed."""
    return re.sub(r"\s+", " ", next(line for line in text.split("\n") if line.strip()).strip())


def found_examples():
    """{(file, key): (kind, line, text)}: key is the command, or a scenario file's first line."""
    found = {}
    for path in doc_files():
        for lang, line, text in fenced_blocks(path):
            if lang in ("", "sh", "bash", "shell", "console"):
                for cmd in shell_commands(text):
                    if INVOKES.search(cmd):
                        found[(path, cmd)] = ("shell", line, cmd)
            elif lang == "toml" and SCENARIO_TOML.search(text):
                found[(path, first_line(text))] = ("toml", line, text)
            elif lang in ("yaml", "yml") and INVOKES.search(text):
                found[(path, first_line(text))] = ("yaml", line, text)
    return found


def E(path, key, action, **kw):
    return dict(kw, path=path, key=key, action=action)


# What the tool pins its numerics to at start-up on an AVX2 + FMA CPU (harness/train/env.cpp): given
# here, it does not re-execute itself to set them, which saves a LibTorch start (about 1.3 s of
# CPU) per command and changes no result.
def pinned():
    with open("/proc/cpuinfo") as f:
        flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
    return {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2"} if {"avx2", "fma"} <= flags else {}


MYCHECK = "# mycheck.toml run: resume-harness matrix mycheck.toml (or: check -f mycheck.toml mine)"
# In the order they run (later ones use what earlier ones wrote: ckpt, run1).
EXAMPLES = [
    E("README.md", "scripts/main.sh", "skip",
      reason="the main job: set-up, build and the 190-cell default matrix, about 15 minutes on 2 cores"),
    E("README.md", "scripts/test.sh", "skip", reason="CI itself (.ci/run runs it), about 20 minutes"),
    E("README.md", "build/resume-harness check 'scaled/moments=fp8,master=remainders,policy=per_key'", "run",
      output="scaled/moments=fp8,master=remainders,policy=per_key: PASS: difference caught as expected: "
             "after load: embedding.weight/exp_avg"),
    # "Check your own trainer": examples/tiny_lm/train.py takes exactly the flags the example passes.
    E("README.md", MYCHECK, "run", file="mine/mycheck.toml", beside={"train.py": "examples/tiny_lm/train.py"},
      command="build/resume-harness check -f mine/mycheck.toml mine --run-dir runs/mine", output="mine: PASS"),
    E("docs/external-trainers.md", MYCHECK, "same", same=("README.md", MYCHECK)),
    E("docs/external-trainers.md", "[[scenario]]", "list", file="megatron/megatron.toml",
      command="build/resume-harness check -f megatron/megatron.toml megatron",
      reason="needs a Megatron-LM checkout and 8 GPUs (torchrun --nproc-per-node 8); --list shows the commands the "
             "check would run"),
    E("scenarios/README.md", "[[scenario]]", "run", file="named/named.toml",
      command="build/resume-harness check -f named/named.toml seed-protocol --run-dir runs/named",
      output="seed-protocol: PASS"),
    E("scenarios/README.md", "[[matrix]]", "list", file="matrix/states.toml",
      command="build/resume-harness matrix matrix/states.toml",
      reason="5 cells and 2 baselines, about 25 s of CPU; ci.toml's states matrix (the CI gate) runs the same "
             "axes"),
    E("scenarios/README.md", "[defaults]", "skip",
      reason="a [defaults] fragment with no scenario of its own and a placeholder cwd (path/to/their/repo); "
             "README's mycheck.toml (run above) and scenarios/external.toml run these keys"),
    E("docs/training.md", "build/resume-harness train --out runs/train", "run"),
    E("docs/training.md", "build/resume-harness train --help", "run", output="--save-policy"),
    E("docs/training.md", "build/resume-harness train --use-precision-aware-optimizer --exp-avg-dtype bf16 "
      "--exp-avg-sq-dtype bf16 --save ckpt --save-at 10 --save-policy per_key --out run1", "run"),
    E("docs/training.md", "build/resume-harness train --load ckpt --out run2", "run"),
    E("docs/training.md", "build/resume-harness train --config run1/config.json --lr 3e-3", "run"),
    # The checkpoint training.md's example above saved.
    E("docs/checkpoints.md", "build/resume-harness inspect CKPT_ROOT", "run", replace={"CKPT_ROOT": "ckpt"},
      output="OK: 2 files verified"),
    E("docs/checkpoints.md", "build/resume-harness inspect iter_10.pt", "skip",
      reason="a torch.save file of the reader's; InspectExternal.TorchSaveFileListsEveryTensorAndValue "
             "(test_cli_inspect_external) inspects one, and two torch imports here cost about 4 s of CPU"),
    E("docs/running.md", "build/resume-harness matrix scenarios/default.toml -j 2", "skip",
      reason="the main job's matrix, 198 cells, about 5 minutes (scripts/main.sh)"),
    E("docs/running.md", "build/resume-harness matrix scenarios/ci.toml -j 2 --golden scenarios/golden/ci", "skip",
      reason="the CI gate, about 2 minutes on 2 cores; scripts/test.sh runs this command"),
    E("docs/running.md", "build/resume-harness check --file scenarios/default.toml "
      "'states/exp_avg=bf16,exp_avg_sq=bf16,master=remainders,policy=per_key'", "list",
      reason="one check like README's (run above), about 8 s of CPU; --list shows that the name is a cell of "
             "default.toml"),
    E("docs/running.md", "build/resume-harness matrix scenarios/default.toml -j 2 --shard 2/4 --run-dir shard-2",
      "list", reason="a quarter of the default matrix, about 75 s; --list shows the cells of shard 2/4; "
                     "Shards.MergedShardsEqualAnUnshardedRun (test_matrix_shard) runs and merges shards"),
    E("docs/running.md", "build/resume-harness report --merge merged shard-1 shard-2 shard-3 shard-4", "skip",
      reason="needs all four shards of the default matrix (above); Shards.* (test_matrix_shard) merges shards"),
    E("docs/data-parallel.md", "build/resume-harness train --nproc 4 --micro-batch-size 4 --out runs/dp4", "skip",
      reason="4 LibTorch ranks on 2 cores, about 9 s of CPU; Reshard.* (test_cli_dist) runs train --nproc 2 and 4"),
    E("docs/data-parallel.md", "torchrun --nproc-per-node 4 build/resume-harness train --micro-batch-size 4 "
      "--out runs/dp4", "skip",
      reason="the run above started by torchrun, which sets the variables --nproc gives its ranks (RANK, "
             "WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"),
    E("docs/data-parallel.md", "srun -n 8 env MASTER_ADDR=node0 MASTER_PORT=29500 build/resume-harness train ...",
      "skip", reason="needs a Slurm cluster; `...` stands for the reader's flags"),
]


class DocsExamples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.found = found_examples()

    def test_every_example_is_listed_and_every_entry_is_in_the_docs(self):
        listed = {(e["path"], e["key"]) for e in EXAMPLES}
        problems = []
        for (path, key), (kind, line, _) in sorted(self.found.items()):
            if kind == "yaml":
                problems.append("%s:%d: a CI fragment that runs the tool: ship it under examples/ci/ "
                                "(tests/test_ci_recipes.py runs those) and link it" % (path, line))
            elif (path, key) not in listed:
                problems.append("%s:%d: %r is a docs example this test neither runs nor skips: add it to EXAMPLES"
                                % (path, line, key))
        for path, key in sorted(listed - set(self.found)):
            problems.append("EXAMPLES names %s: %r, which is in no fenced block there any more" % (path, key))
        for e in EXAMPLES:
            if e["action"] in ("skip", "list") and not e.get("reason"):
                problems.append("%s: %r: say why it is not run" % (e["path"], e["key"]))
        self.assertEqual(problems, [], "\n".join(problems))

    def test_examples_run(self):
        work = tempfile.mkdtemp(prefix="rh_docs_")
        try:
            for name in os.listdir(ROOT):
                if name not in (".git", "build", "runs"):
                    os.symlink(os.path.join(ROOT, name), os.path.join(work, name))
            os.symlink(os.path.dirname(TOOL), os.path.join(work, "build"))
            os.mkdir(os.path.join(work, "runs"))
            env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
            env.update({k: v for k, v in pinned().items() if not os.environ.get(k)})
            t_all = time.time()
            for e in EXAMPLES:
                found = self.found.get((e["path"], e["key"]))
                if found is None or e["action"] == "skip":
                    continue   # a missing one fails the listing test
                with self.subTest(example="%s: %s" % (e["path"], e["key"][:60])):
                    self.run_example(e, found, work, env)
            print("test_docs_examples: %.1f s for the examples" % (time.time() - t_all))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def run_example(self, e, found, work, env):
        kind, line, text = found
        where = "%s:%d" % (e["path"], line)
        if e["action"] == "same":
            other = self.found[e["same"]]
            self.assertEqual(tomllib.loads(text), tomllib.loads(other[2]), "%s is no longer a copy of %s:%d"
                             % (where, e["same"][0], other[1]))
            print("test_docs_examples: %s: the same TOML as %s:%d (run there)" % (where, e["same"][0], other[1]))
            return
        if kind == "toml":
            path = os.path.join(work, e["file"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
            for name, src in e.get("beside", {}).items():
                shutil.copy(os.path.join(ROOT, src), os.path.join(os.path.dirname(path), name))
            cmd = e["command"]
        else:
            cmd = text
            for a, b in e.get("replace", {}).items():
                cmd = cmd.replace(a, b)
        if e["action"] == "list":
            cmd += " --list"
        t0 = time.time()
        p = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        print("test_docs_examples: %s: `%s`: exit %d in %.1f s" % (where, cmd, p.returncode, time.time() - t0))
        want = e.get("rc", 0)
        self.assertEqual(p.returncode, want, "%s: `%s` exited %d, the docs say %d:\n%s" % (where, cmd, p.returncode,
                                                                                         want, out[-4000:]))
        if e["action"] == "list":
            self.assertTrue(p.stdout.strip(), "%s: `%s` listed nothing" % (where, cmd))
        if "output" in e:
            self.assertIn(e["output"], out, "%s: `%s`" % (where, cmd))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_docs_examples.py PATH_TO_resume-harness")
    TOOL = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
