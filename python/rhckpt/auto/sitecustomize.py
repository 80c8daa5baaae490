"""resume-harness's `probe = "auto"` entry point: with <repo>/python/rhckpt/auto first on
PYTHONPATH, Python's site module imports this file instead of the system's sitecustomize. It
installs rhckpt.autoprobe (which does nothing without RH_PROBE_AUTO=1) and then runs the next
sitecustomize on sys.path (Debian's /usr/lib/python3.X/sitecustomize.py), so the interpreter
otherwise starts as it would without us.

autoprobe.py is loaded from its file, not as `rhckpt.autoprobe`: importing the package would run
rhckpt/__init__.py, which imports numpy before the trainer could set its thread variables.
"""


def _run():
    import importlib.machinery
    import importlib.util
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        path = os.path.join(os.path.dirname(here), "autoprobe.py")
        spec = importlib.util.spec_from_file_location("_rhckpt_autoprobe", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mod.install()
    except Exception as e:   # the probe never stops the trainer from starting
        sys.stderr.write("rhckpt.autoprobe: not installed: %s: %s\n" % (type(e).__name__, str(e).split("\n")[0]))
    # the sitecustomize we shadow: the next one on sys.path after our own directory
    rest, seen = [], False
    for entry in sys.path:
        if seen:
            rest.append(entry)
        elif os.path.abspath(entry or ".") == here:
            seen = True
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        nxt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nxt)   # its errors surface as site.py reports them without us


_run()
del _run
