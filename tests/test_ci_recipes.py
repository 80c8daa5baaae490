#!/usr/bin/python3
"""The CI recipes users copy, examples/ci/github-actions.yml and examples/ci/gitlab-ci.yml, parsed
and run: no runner (GitHub's or GitLab's) can be reached from here, so this test checks what a
runner would need and runs what a runner would run.

Structure (PyYAML): GitHub: `on:` pull_request and push to main, a `debian:12` container, every
step has exactly one of `run`/`uses`, every action is one the run below knows how to stand in for,
the gate's command, the upload of the gate's run directory, the download of main's run into the
directory the comparison reads, and the JUnit publisher reading the gate's `--junit` path. GitLab:
`image: debian:12`, rules for merge requests and the default branch, no `|| true`, the gate's
command, `artifacts:paths` holding the run directory and `artifacts:reports:junit` the gate's
`--junit` path. Every flag of every `resume-harness` command in a recipe is in that subcommand's
`--help`, and every scenario file and golden directory it names is in the repository (the tool
would otherwise find an installed copy beside itself).

Run: each recipe twice, each time in a fresh `git clone` of this repository under a temporary
directory (uncommitted changes to tracked files applied, so a change is tested before it is
committed; a clean CI checkout has none): first as a run on main (no earlier main run: the
"no main run to compare with" branch), then as a pull / merge request whose download step gets
that first run (the comparison branch). Every `run:` step (GitHub) and every `before_script` +
`script` line (GitLab) runs in order, with bash as the runner runs it (GitHub: `bash --noprofile
--norc -eo pipefail`, the recipe's `shell: bash`; GitLab: one script, `set -eo pipefail`) and the
environment a runner gives ($GITHUB_STEP_SUMMARY a file, $GITHUB_EVENT_NAME, ...; $CI_JOB_TOKEN,
$CI_API_V4_URL, $CI_PROJECT_ID, ...; plus the two variables the tool would pin itself to, so it
does not re-execute itself, see pinned()). `if:` conditions are evaluated (always(), success(),
failure(), steps.<id>.outcome, github.event_name). The actions (`uses:`) cannot run here and are
stood in for: checkout is the clone itself; upload-artifact keeps a copy of its `path` (which must
exist); download-artifact gives the main run's copy, or nothing (its warning); the JUnit publisher
parses the file it is given. GitLab's job artifacts API is a local HTTP server that answers the
recipe's request (the same URL path and JOB-TOKEN header) with a zip of the main run's artifacts,
or 404 when there is none. Any step that fails, a step that is skipped when it should run, or a
missing artifact path fails the test.

Cost. CI's whole budget is about 20 minutes, so by default (CI mode) three steps are replaced,
each printed as it is, and nothing else:
  - `scripts/setup.sh build` (packages and a fresh build, ~10 min): `build` becomes a link to the
    directory of the tool under test (the build of this same tree);
  - the `apt-get update && apt-get install ... PKGS` line: `dpkg-query -W PKGS` (the packages must
    be installed here; scripts/setup.sh installs them);
  - the gate `matrix scenarios/ci.toml ...` (~4 min): the same command with
    `--filter seed-protocol` appended (one cell and its baseline, then the report).
RH_CI_RECIPES_FULL=1 runs every step exactly as written (setup.sh builds the clone, the gate runs
the whole matrix; root is needed for apt-get), each pass in its own clone, so four fresh builds;
RH_CI_RECIPES_FULL=main runs only the first (main) pass of each recipe that way. Pick one recipe
with its test's name (GitHubActions.test_steps_run_in_a_clean_clone).

  /usr/bin/python3 tests/test_ci_recipes.py PATH_TO_resume-harness     (CTest passes it)

Exit 0 when every check passes, 1 naming what failed, 77 (skipped) when this tree is not a git
repository or PyYAML is missing."""
import glob
import http.server
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import xml.etree.ElementTree as ET
import zipfile

try:
    import yaml
except ImportError:   # python3-yaml (scripts/setup.sh installs it)
    yaml = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GITHUB = os.path.join(ROOT, "examples", "ci", "github-actions.yml")
GITLAB = os.path.join(ROOT, "examples", "ci", "gitlab-ci.yml")
TOOL = None
FULL = os.environ.get("RH_CI_RECIPES_FULL") in ("1", "main")
FULL_MAIN_ONLY = os.environ.get("RH_CI_RECIPES_FULL") == "main"   # the main pass of each recipe only
CI_FILTER = "seed-protocol"   # one cell, one baseline: ~10 s of CPU with the report
GATE = re.compile(r"build/resume-harness matrix scenarios/ci\.toml\b[^\n|;&]*")
SETUP = "scripts/setup.sh build"
APT = re.compile(r"apt-get update -qq && apt-get install -y -qq --no-install-recommends ((?:[a-z0-9.+-]+ ?)+)$")
KNOWN_ACTIONS = ("actions/checkout@v4", "actions/upload-artifact@v4", "dawidd6/action-download-artifact@v6",
                 "mikepenz/action-junit-report@v4")
STEP_TIMEOUT = 3600 if FULL else 300


def pinned():
    """What the tool pins its numerics to at start-up on an AVX2 + FMA CPU (harness/train/env.cpp).
    Given in each step's environment, the tool does not re-execute itself to set them: a LibTorch
    start (about 1.3 s of CPU) less per command, the same results."""
    with open("/proc/cpuinfo") as f:
        flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
    want = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2"} if {"avx2", "fma"} <= flags else {}
    return {k: v for k, v in want.items() if not os.environ.get(k)}


def load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def note(msg):
    print("test_ci_recipes: " + msg, flush=True)


def gate_options(cmd):
    """The gate command's --run-dir and --junit values."""
    argv = shlex.split(cmd)
    out = {}
    for flag in ("--run-dir", "--junit", "--golden"):
        if flag in argv:
            out[flag] = argv[argv.index(flag) + 1]
    return out


def substitute(script, tool_dir):
    """CI mode: the three replacements (docstring), each printed; in full mode the script as written."""
    if FULL:
        return script
    lines = []
    for line in script.split("\n"):
        stripped = line.strip()
        if stripped == SETUP:
            new = "ln -s %s build" % shlex.quote(tool_dir)
            note("CI mode: `%s` -> `%s` (the tool under test)" % (SETUP, new))
            line = line.replace(SETUP, new)
        elif APT.match(stripped):
            new = "dpkg-query -W %s > /dev/null" % APT.match(stripped).group(1).strip()
            note("CI mode: `%s` -> `%s`" % (stripped, new))
            line = line.replace(stripped, new)
        else:
            m = GATE.search(line)
            if m:
                gate = m.group(0).rstrip()
                new = gate + " --filter " + shlex.quote(CI_FILTER)
                note("CI mode: the gate gets `--filter %s` (every cell in full mode)" % shlex.quote(CI_FILTER))
                line = line.replace(gate, new)
        lines.append(line)
    return "\n".join(lines)


def fresh_clone(dest):
    """A clone of this repository at HEAD, with the tree's uncommitted changes to tracked files."""
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", ROOT, dest], check=True)
    subprocess.run(["git", "-C", dest, "checkout", "-q", "--detach", head], check=True)
    diff = subprocess.run(["git", "-C", ROOT, "diff", "HEAD", "--binary"], capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "-C", dest, "apply", "--whitespace=nowarn", "-"], input=diff, check=True)
        note("applied the tree's uncommitted changes to tracked files (%d bytes of diff)" % len(diff))


def run_script(what, script, cwd, env, argv):
    t0 = time.time()
    p = subprocess.run(argv + [script], cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    note("%s: exit %d in %.1f s" % (what, p.returncode, time.time() - t0))
    return p


def junit_cases(path):
    root = ET.parse(path).getroot()
    return root.iter("testcase")


HELP_FLAGS = {}


def tool_help_flags(sub):
    """The options `resume-harness SUB --help` lists (the first word of each option line)."""
    if sub not in HELP_FLAGS:
        p = subprocess.run([TOOL, sub, "--help"], capture_output=True, text=True, timeout=60, env=dict(os.environ,
                                                                                                      **pinned()))
        assert p.returncode == 0, p.stdout + p.stderr
        HELP_FLAGS[sub] = {f for m in re.finditer(r"^\s+(-[-\w,]+)", p.stdout, re.M) for f in m.group(1).split(",")}
    return HELP_FLAGS[sub]


def tool_commands(text):
    """Every `build/resume-harness SUB args...` in a script, up to a shell operator or redirection."""
    for m in re.finditer(r"build/resume-harness ([^\n|;&>]*)", text):
        yield shlex.split(m.group(1))


class Checks:
    """What both recipes share: tool flags and named files."""

    def check_tool_commands(self, scripts):
        seen = 0
        for text in scripts:
            for argv in tool_commands(text):
                seen += 1
                sub = argv[0]
                flags = tool_help_flags(sub)
                for a in argv[1:]:
                    if a.startswith("-"):
                        self.assertIn(a.split("=")[0], flags, "`%s %s`: `%s` is no flag of `resume-harness %s`"
                                      % (sub, " ".join(argv[1:]), a, sub))
                for a in argv[1:]:
                    if a.startswith("scenarios/"):
                        self.assertTrue(os.path.exists(os.path.join(ROOT, a)), "%s names %s, which is not in the "
                                        "repository" % (" ".join(argv), a))
        self.assertGreater(seen, 1)


@unittest.skipIf(yaml is None, "PyYAML (python3-yaml) is not installed")
class GitHubActions(unittest.TestCase, Checks):
    def setUp(self):
        self.wf = load(GITHUB)
        (self.job_name, self.job), = self.wf["jobs"].items()
        self.steps = self.job["steps"]

    def gate(self):
        gates = [s for s in self.steps if "run" in s and GATE.search(s["run"])]
        self.assertEqual(len(gates), 1, "one step runs the gate")
        return gates[0]

    def test_structure(self):
        on = self.wf.get("on", self.wf.get(True))   # YAML 1.1 reads a bare `on` as true
        self.assertIn("pull_request", on)
        self.assertIn("main", on["push"]["branches"], "main's run is what a pull request compares against")
        self.assertEqual(self.job["container"], "debian:12", "scripts/setup.sh needs Debian 12's apt")
        self.assertIn("runs-on", self.job)
        self.assertEqual(self.job.get("defaults", {}).get("run", {}).get("shell"), "bash")
        for s in self.steps:
            self.assertEqual(len({"run", "uses"} & set(s)), 1, "a step has one of run/uses: %r" % s)
            if "uses" in s:
                self.assertIn(s["uses"], KNOWN_ACTIONS, "an action this test cannot stand in for")
            else:
                self.assertNotIn("${{", s["run"], "expressions in run: are not run by this test: use env")
                self.assertNotIn("|| true", s["run"])
        uses = [s.get("uses", "") for s in self.steps]
        self.assertEqual(uses.index("actions/checkout@v4"), 1, "the checkout comes second, after its packages")
        gate = self.gate()
        self.assertEqual(gate["run"].strip(), "build/resume-harness matrix scenarios/ci.toml --golden "
                         "scenarios/golden/ci --run-dir run --junit junit.xml")
        self.assertNotIn("if", gate, "the gate runs when everything before it passed")
        opts = gate_options(gate["run"])
        up, = [s for s in self.steps if s.get("uses", "").startswith("actions/upload-artifact")]
        down, = [s for s in self.steps if s.get("uses", "").startswith("dawidd6/action-download-artifact")]
        junit, = [s for s in self.steps if s.get("uses", "").startswith("mikepenz/action-junit-report")]
        self.assertEqual(up["with"]["path"], opts["--run-dir"])
        self.assertEqual(down["with"]["name"], up["with"]["name"], "the download takes what the upload wrote")
        self.assertEqual(down["with"]["branch"], "main")
        self.assertEqual(junit["with"]["report_paths"], opts["--junit"])
        compare, = [s for s in self.steps if "report --compare" in s.get("run", "")]
        self.assertIn("%s/summary.csv" % down["with"]["path"], compare["run"])
        self.assertIn("no main run to compare with", compare["run"])
        self.assertIn('"$GITHUB_STEP_SUMMARY"', compare["run"])
        self.check_tool_commands([s["run"] for s in self.steps if "run" in s])

    def test_steps_run_in_a_clean_clone(self):
        tmp = tempfile.mkdtemp(prefix="rh_ci_github_")
        try:
            main_run = self.run_job(tmp, "main", event="push", main_artifact=None)
            self.assertIn("no main run to compare with", main_run["summary"])
            if FULL_MAIN_ONLY:
                note("RH_CI_RECIPES_FULL=main: the pull request pass is left out")
                return
            pr = self.run_job(tmp, "pr", event="pull_request", main_artifact=main_run["artifacts"]["resume-run"])
            self.assertIn("## resume-harness: run comparison", pr["summary"])
            self.assertIn("0 regression(s)", pr["summary"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def run_job(self, tmp, tag, event, main_artifact):
        """Runs the job's steps in order; returns its summary text and uploaded artifacts."""
        note("GitHub Actions, %s event" % event)
        ws = os.path.join(tmp, tag, "workspace")
        os.makedirs(ws)
        runner_temp = os.path.join(tmp, tag, "runner_temp")
        os.makedirs(runner_temp)
        env = dict(os.environ, **pinned(), CI="true", GITHUB_ACTIONS="true", GITHUB_EVENT_NAME=event,
                   GITHUB_REF="refs/heads/main" if event == "push" else "refs/pull/1/merge",
                   GITHUB_WORKSPACE=ws, RUNNER_TEMP=runner_temp)
        env.update({k: str(v) for k, v in self.job.get("env", {}).items()})
        outcomes, artifacts, summary, skipped = {}, {}, [], []
        failed = False
        for i, s in enumerate(self.steps):
            what = "step %d (%s)" % (i + 1, s.get("name") or s.get("uses") or s["run"][:60])
            if not self.condition(s.get("if"), failed, outcomes, event, ws):
                note("%s: skipped (if: %s)" % (what, s.get("if")))
                outcomes[s.get("id", i)] = "skipped"
                skipped.append(what)
                continue
            if "uses" in s:
                ok = self.stand_in(s, what, ws, artifacts, main_artifact)
            else:
                step_summary = os.path.join(runner_temp, "step_summary_%d" % i)
                open(step_summary, "w").close()
                senv = dict(env, GITHUB_STEP_SUMMARY=step_summary)
                senv.update({k: str(v) for k, v in s.get("env", {}).items()})
                p = run_script(what, substitute(s["run"], os.path.dirname(os.path.abspath(TOOL))), ws, senv,
                               ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"])
                ok = p.returncode == 0
                self.assertTrue(ok, "%s failed (exit %d):\n%s%s" % (what, p.returncode, p.stdout[-3000:],
                                                                    p.stderr[-3000:]))
                with open(step_summary) as f:
                    summary.append(f.read())
            outcomes[s.get("id", i)] = "success" if ok else "failure"
            failed = failed or not ok
        self.assertFalse(failed)
        self.assertEqual(skipped, [], "with the gate passing, every step runs")
        return {"summary": "".join(summary), "artifacts": artifacts}

    def condition(self, expr, failed, outcomes, event, ws):
        """GitHub's `if:` for the functions and contexts the recipe uses; anything else fails the test."""
        if expr is None:
            return not failed
        functions = {"always": lambda: True, "success": lambda: not failed, "failure": lambda: failed,
                     "cancelled": lambda: False,
                     "hashFiles": lambda *pats: "x" if any(glob.glob(os.path.join(ws, p)) for p in pats) else ""}
        out, status_function = [], False
        for tok in re.findall(r"\s+|&&|\|\||==|!=|!|\(|\)|,|'[^']*'|[A-Za-z_][\w.-]*", expr):
            if tok.isspace():
                continue
            if tok == "&&":
                out.append(" and ")
            elif tok == "||":
                out.append(" or ")
            elif tok == "!":
                out.append(" not ")
            elif tok in ("==", "!=", "(", ")", ",") or tok.startswith("'"):
                out.append(tok)
            elif tok in functions:
                status_function = status_function or tok in ("always", "success", "failure", "cancelled")
                out.append("f_" + tok)
            elif tok == "github.event_name":
                out.append(repr(event))
            elif re.fullmatch(r"steps\.[\w-]+\.(outcome|conclusion)", tok):
                out.append(repr(outcomes.get(tok.split(".")[1], "")))
            else:
                self.fail("if: %s: `%s` is not known to this test (extend condition())" % (expr, tok))
        text = "".join(out)
        value = eval(text, {"__builtins__": {}}, {"f_" + k: v for k, v in functions.items()})
        return bool(value) if status_function else (not failed and bool(value))

    def stand_in(self, s, what, ws, artifacts, main_artifact):
        uses, w = s["uses"], s.get("with", {})
        if uses.startswith("actions/checkout"):
            fresh_clone(ws)
            note("%s: the clean clone (%s)" % (what, ws))
        elif uses.startswith("actions/upload-artifact"):
            path = os.path.join(ws, w["path"])
            self.assertTrue(os.path.exists(path), "%s: %s does not exist" % (what, w["path"]))
            keep = os.path.join(os.path.dirname(ws), "artifact-" + w["name"])
            shutil.copytree(path, keep, symlinks=True)
            artifacts[w["name"]] = keep
            note("%s: kept %s as artifact %s" % (what, w["path"], w["name"]))
        elif uses.startswith("dawidd6/action-download-artifact"):
            if main_artifact is None:
                note("%s: no artifact %s on branch %s (the action warns: if_no_artifact_found: %s)"
                     % (what, w["name"], w["branch"], w.get("if_no_artifact_found")))
                self.assertEqual(w.get("if_no_artifact_found"), "warn", "a missing main run fails the job")
            else:
                shutil.copytree(main_artifact, os.path.join(ws, w["path"]), symlinks=True)
                note("%s: main's artifact into %s" % (what, w["path"]))
        elif uses.startswith("mikepenz/action-junit-report"):
            path = os.path.join(ws, w["report_paths"])
            self.assertTrue(os.path.isfile(path), "%s: %s does not exist" % (what, w["report_paths"]))
            n = len(list(junit_cases(path)))
            self.assertGreater(n, 0, "%s: no test case in %s" % (what, w["report_paths"]))
            note("%s: %s holds %d test cases" % (what, w["report_paths"], n))
        else:
            self.fail("%s: no stand-in for %s" % (what, uses))
        return True


class NegativeControls(unittest.TestCase, Checks):
    """The flag and file checks catch what they are for (a recipe step that fails is caught by the
    runs above: its exit code fails the test)."""

    def test_a_flag_no_subcommand_has_is_caught(self):
        with self.assertRaisesRegex(AssertionError, "--comparison` is no flag of `resume-harness report"):
            self.check_tool_commands(["build/resume-harness matrix scenarios/ci.toml --run-dir run",
                                      "build/resume-harness report --comparison main-run run | tee compare.md"])

    def test_a_scenario_file_not_in_the_repository_is_caught(self):
        with self.assertRaisesRegex(AssertionError, "scenarios/cj.toml, which is not in the repository"):
            self.check_tool_commands(["build/resume-harness matrix scenarios/cj.toml --run-dir run",
                                      "build/resume-harness report --compare main-run run"])


class ArtifactsApi(http.server.BaseHTTPRequestHandler):
    """GitLab's GET /projects/:id/jobs/artifacts/:ref/download?job=NAME, for one project, ref and job."""
    expected_path = None
    token = None
    archive = None    # bytes of a zip, or None: 404 (no successful job on the ref)
    requests = []

    def do_GET(self):
        type(self).requests.append(self.path)
        if self.path != self.expected_path or self.headers.get("JOB-TOKEN") != self.token:
            self.send_response(401 if self.headers.get("JOB-TOKEN") != self.token else 400)
            self.end_headers()
            return
        if self.archive is None:
            body = b'{"message":"404 Not found"}'
            self.send_response(404)
        else:
            body = self.archive
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@unittest.skipIf(yaml is None, "PyYAML (python3-yaml) is not installed")
class GitLabCi(unittest.TestCase, Checks):
    JOB = "resume-check"

    def setUp(self):
        self.doc = load(GITLAB)
        self.job = self.doc[self.JOB]

    def lines(self):
        return self.job.get("before_script", []) + self.job["script"]

    def test_structure(self):
        self.assertEqual(self.job["image"], "debian:12", "scripts/setup.sh needs Debian 12's apt")
        for key in self.job:
            self.assertIn(key, ("image", "rules", "before_script", "script", "after_script", "artifacts"))
        sources = [r["if"] for r in self.job["rules"]]
        self.assertIn('$CI_PIPELINE_SOURCE == "merge_request_event"', sources)
        self.assertIn("$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH", sources, "the default branch's run is what a "
                      "merge request compares against")
        text = "\n".join(self.lines())
        self.assertNotIn("|| true", text, "a missing main run is said, not hidden")
        self.assertIn("no main run to compare with", text)
        gates = [line for line in self.job["script"] if GATE.search(line)]
        self.assertEqual(len(gates), 1)
        self.assertIn("build/resume-harness matrix scenarios/ci.toml --golden scenarios/golden/ci --run-dir run "
                      "--junit junit.xml", gates[0])
        self.assertEqual(self.job["script"][-1].strip(), 'exit "$gate"', "the gate's exit code ends the job")
        opts = gate_options(GATE.search(gates[0]).group(0))
        art = self.job["artifacts"]
        self.assertEqual(art["when"], "always")
        self.assertIn(opts["--run-dir"] + "/", art["paths"])
        self.assertEqual(art["reports"]["junit"], opts["--junit"])
        self.check_tool_commands(self.lines())

    def test_scripts_run_in_a_clean_clone(self):
        tmp = tempfile.mkdtemp(prefix="rh_ci_gitlab_")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ArtifactsApi)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            ArtifactsApi.token = "job-token-%d" % os.getpid()
            ArtifactsApi.expected_path = "/api/v4/projects/42/jobs/artifacts/main/download?job=" + self.JOB
            api = "http://127.0.0.1:%d/api/v4" % server.server_address[1]
            ArtifactsApi.archive = None
            main_job = self.run_job(tmp, "main", api, merge_request=False)
            self.assertIn("no main run to compare with", main_job["log"])
            if FULL_MAIN_ONLY:
                note("RH_CI_RECIPES_FULL=main: the merge request pass is left out")
                return
            ArtifactsApi.archive = main_job["archive"]
            mr = self.run_job(tmp, "mr", api, merge_request=True)
            with open(os.path.join(mr["ws"], "compare.md")) as f:
                compare = f.read()
            self.assertIn("## resume-harness: run comparison", compare)
            self.assertIn("0 regression(s)", compare)
            self.assertEqual(ArtifactsApi.requests, [ArtifactsApi.expected_path] * 2, "one request per job")
        finally:
            server.shutdown()
            server.server_close()
            shutil.rmtree(tmp, ignore_errors=True)

    def rules_select(self, env):
        for rule in self.job["rules"]:
            m = re.fullmatch(r'\$(\w+) == (?:\$(\w+)|"([^"]*)")', rule["if"])
            self.assertIsNotNone(m, "rule %r is not known to this test" % rule["if"])
            rhs = env.get(m.group(2), "") if m.group(2) else m.group(3)
            if env.get(m.group(1), "") == rhs:
                return True
        return False

    def run_job(self, tmp, tag, api, merge_request):
        note("GitLab CI, %s pipeline" % ("merge request" if merge_request else "default-branch"))
        ws = os.path.join(tmp, tag, "project")
        fresh_clone(ws)   # the runner clones before the job's image runs anything
        env = dict(os.environ, **pinned(), CI="true", GITLAB_CI="true", CI_JOB_NAME=self.JOB,
                   CI_JOB_TOKEN=ArtifactsApi.token, CI_API_V4_URL=api, CI_PROJECT_ID="42", CI_DEFAULT_BRANCH="main",
                   CI_PROJECT_DIR=ws,
                   CI_PIPELINE_SOURCE="merge_request_event" if merge_request else "push",
                   CI_COMMIT_REF_NAME="feature" if merge_request else "main")
        env.pop("RH_MAIN_RUN_TOKEN", None)
        env.pop("CI_COMMIT_BRANCH", None)   # GitLab leaves it unset in merge request pipelines
        if not merge_request:
            env["CI_COMMIT_BRANCH"] = "main"
        self.assertTrue(self.rules_select(env), "the job's rules leave it out of this pipeline")
        script = "set -eo pipefail\n" + "\n".join(self.lines())
        p = run_script("before_script + script", substitute(script, os.path.dirname(os.path.abspath(TOOL))),
                       ws, env, ["bash", "--noprofile", "--norc", "-c"])
        log = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, "the job failed (exit %d):\n%s" % (p.returncode, log[-5000:]))
        art = self.job["artifacts"]
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:   # what GitLab keeps: artifacts:paths, relative to the project
            for path in art["paths"]:
                full = os.path.join(ws, path)
                self.assertTrue(os.path.exists(full), "artifacts:paths: %s does not exist after the job" % path)
                for f in ([full] if os.path.isfile(full) else
                          [os.path.join(d, n) for d, _, ns in os.walk(full) for n in ns]):
                    z.write(f, os.path.relpath(f, ws))
        junit = os.path.join(ws, art["reports"]["junit"])
        self.assertTrue(os.path.isfile(junit), "artifacts:reports:junit: %s does not exist" % art["reports"]["junit"])
        self.assertGreater(len(list(junit_cases(junit))), 0)
        return {"log": log, "ws": ws, "archive": buf.getvalue()}


def main():
    global TOOL
    if len(sys.argv) < 2:
        sys.exit("usage: test_ci_recipes.py PATH_TO_resume-harness")
    TOOL = os.path.abspath(sys.argv.pop(1))
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        print("test_ci_recipes: %s is not a git repository: nothing to clone" % ROOT)
        sys.exit(77)
    if yaml is None:
        print("test_ci_recipes: PyYAML (python3-yaml) is not installed")
        sys.exit(77)
    note("mode: %s" % ("full (RH_CI_RECIPES_FULL=%s): every step as written" % os.environ["RH_CI_RECIPES_FULL"]
                       if FULL else
                       "CI (RH_CI_RECIPES_FULL=1 runs every step as written)"))
    t0 = time.time()
    ok = unittest.main(argv=sys.argv, exit=False, verbosity=2).result.wasSuccessful()
    note("%.1f s in all" % (time.time() - t0))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
