"""rhckpt.autoprobe: the records of rhckpt.probe without editing the trainer (resume-harness's
`probe = "auto"`). The harness starts the trainer with PYTHONPATH=<repo>/python/rhckpt/auto:
<repo>/python (before any PYTHONPATH already set), whose sitecustomize.py calls install(), and:

    RH_PROBE_AUTO=1                 install the hooks (unset, empty or 0: install() does nothing)
    RH_PROBE_DIR=DIR                where probe.jsonl goes (probe.rank<RANK>.jsonl for RANK not 0)
    RH_PROBE_FIRST_ITERATION=N      the iteration of this process's first optimizer step (default 1;
                                    K+1 for a run resumed from iteration K): step j (0-based) is N+j
    RH_PROBE_BEFORE=M               also record the state right before iteration M's step (0: none)

Records, in the format of rhckpt.probe (metrics always empty, no data/ or state/ keys):
  {"event": "step", "iteration": i, ...}         after iteration i's optimizer step and, when the
      trainer has an LR scheduler on that optimizer, after the scheduler's next step() (the point
      where a manual probe.after_step usually sits; if the scheduler does not step before the next
      optimizer step, a load or the exit, the record is written then with the state after the
      optimizer step)
  {"event": "before_step", "iteration": i, ...}  right before the step: for the first step after a
      checkpoint load in this process (torch.load, any nn.Module.load_state_dict or
      Optimizer.load_state_dict), and for iteration RH_PROBE_BEFORE; once per iteration. Whatever
      order a trainer restores things in, this is the state the uninterrupted run held before the
      same step, so the harness compares the two before_step records of iteration K+1.

What it sees: the optimizer whose step ran (param groups, each parameter's state), the model (the
top-level nn.Module holding the most of that optimizer's parameters, found once by a gc scan,
unwrapped through .module and torch.compile's ._orig_mod: parameters, buffers, train/eval mode of
every submodule), the LR scheduler (a torch.optim.lr_scheduler object, or one with .optimizer,
state_dict() and last_epoch/get_last_lr, whose .optimizer is that optimizer; the outermost of a
SequentialLR/ChainedScheduler), and the RNG streams (python, numpy if imported, torch, cuda).
Without a model the optimizer's parameters are labelled by index, as rhckpt.probe does.

What it cannot see: the batch, the trainer's own counters and data position, metrics and losses,
anything outside those objects (an EMA copy not inside the model, a GradScaler). It counts
optimizer steps, so a trainer whose iteration is not exactly one torch.optim.Optimizer.step (two
steps per iteration, steps skipped on overflow by a GradScaler, a fused or foreign optimizer that
is no torch.optim.Optimizer, DeepSpeed) gets other iteration numbers or no records. Several
optimizers: it follows the first one that steps (until it is garbage-collected, then the next
one that steps), ignores the others' steps and says so once on stderr. A scheduler or model made
after the first record is not seen (the scan runs again only for a new optimizer). A trainer that
starts other Python processes that step optimizers (not DataLoader workers) writes their records
to the same file unless RANK tells them apart.

It never imports torch: an import hook patches torch.optim.optimizer, torch.serialization and
torch.nn.modules.module right after the trainer's own import loads them. Steps are seen through
torch >= 2.0's global optimizer step hooks, or on torch 1.13 by wrapping each Optimizer class's
step once, at class level, when its first instance is made (so LR schedulers' instance wrappers
still call it). It only reads (no RNG draw, no in-place op, no .grad); on any error of its own it
prints one line "rhckpt.autoprobe: ..." to stderr and records nothing more.
"""
import atexit
import functools
import gc
import os
import sys
import threading
import weakref

if __package__ == "rhckpt":
    from . import probe
else:   # loaded from its file by auto/sitecustomize.py: not through the package (numpy)
    import importlib.util as _util
    _spec = _util.spec_from_file_location("_rhckpt_probe", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "probe.py"))
    probe = _util.module_from_spec(_spec)
    _spec.loader.exec_module(probe)

MARK = "_rhckpt_autoprobe"   # set on every function we wrap, so nothing is wrapped twice
_HEAD = ("scheduler/", "optimizer/param_groups/")   # the rows an LR scheduler's step changes
_rec = None   # the one _Recorder, once installed


def say(what):
    sys.stderr.write("rhckpt.autoprobe: %s\n" % what)
    sys.stderr.flush()


def install():
    """Installs the import hook per the environment; returns whether it did. Never raises."""
    global _rec
    flag = os.environ.get("RH_PROBE_AUTO", "")
    if flag in ("", "0"):
        return False
    if _rec is not None:
        return True
    try:
        where = os.environ.get(probe.ENV)
        if not where:
            say("RH_PROBE_AUTO is set without %s: recording nothing" % probe.ENV)
            return False
        try:
            first = int(os.environ.get("RH_PROBE_FIRST_ITERATION") or 1)
            before = int(os.environ.get("RH_PROBE_BEFORE") or 0)
        except ValueError:
            say("RH_PROBE_FIRST_ITERATION and RH_PROBE_BEFORE must be integers: recording nothing")
            return False
        _rec = _Recorder(where, first, before)
        patches = {"torch.optim.optimizer": _patch_optimizer, "torch.serialization": _patch_serialization,
                   "torch.nn.modules.module": _patch_module}
        for name in [n for n in patches if n in sys.modules]:   # torch imported before us after all
            _patched(patches.pop(name), sys.modules[name])
        if patches:
            sys.meta_path.insert(0, _Finder(patches))
        atexit.register(_rec.at_exit)
        return True
    except Exception as e:
        say("not installed: %s" % _line(e))
        return False


def _line(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0]) if text else type(e).__name__


# --- the import hook --------------------------------------------------------------------------------

class _Finder:
    """Finds the watched torch modules through the other finders, and makes their loaders patch
    each module right after executing it (once)."""

    def __init__(self, patches):
        self.patches = patches   # module name -> patch(module)

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            patch, real = self.patches.pop(name), loader.exec_module

            def exec_module(module):
                real(module)
                _patched(patch, module)
            loader.exec_module = exec_module   # an instance attribute: this module's loader only
            return spec
        except Exception:
            return None   # the ordinary import goes on without us


def _patched(patch, module):
    try:
        patch(module)
    except Exception as e:
        _rec.fail("patching %s: %s" % (module.__name__, _line(e)))


def _wrap(fn, before=None, after=None):
    """fn with before(*args) called first and after(*args) once it returned (functools.wraps:
    torch's own `hooked` flag on Optimizer.step is carried over)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if before is not None:
            before(*args)
        out = fn(*args, **kwargs)
        if after is not None:
            after(*args)
        return out
    setattr(wrapper, MARK, True)
    return wrapper


def _patch_serialization(mod):
    if not getattr(mod.load, MARK, False):
        mod.load = _wrap(mod.load, before=_rec.loading, after=_rec.loaded)
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "load", None) is getattr(mod.load, "__wrapped__", None):
        torch.load = mod.load   # torch bound it before we patched


def _patch_module(mod):
    m = mod.Module
    if not getattr(m.load_state_dict, MARK, False):
        m.load_state_dict = _wrap(m.load_state_dict, before=_rec.loading, after=_rec.loaded)


def _patch_optimizer(mod):
    opt = mod.Optimizer
    if not getattr(opt.load_state_dict, MARK, False):
        opt.load_state_dict = _wrap(opt.load_state_dict, before=_rec.loading, after=_rec.loaded)
    if hasattr(mod, "register_optimizer_step_pre_hook"):   # torch >= 2.0: global hooks
        mod.register_optimizer_step_pre_hook(lambda o, args, kwargs: _rec.pre_step(o))
        mod.register_optimizer_step_post_hook(lambda o, args, kwargs: _rec.post_step(o))
        return
    # torch 1.13: every Optimizer.__init__ (and __setstate__) calls _hook_for_profile, which wraps
    # the class's step once for the profiler; ours wraps it right after, at class level too
    hook = opt._hook_for_profile

    @functools.wraps(hook)
    def _hook_for_profile(self):
        hook(self)
        try:
            _wrap_step(type(self))
        except Exception as e:
            _rec.fail("wrapping %s.step: %s" % (type(self).__name__, _line(e)))
    opt._hook_for_profile = _hook_for_profile


def _wrap_step(cls):
    step = getattr(cls, "step", None)
    if step is None or getattr(step, MARK, False):
        return

    @functools.wraps(step)
    def step_and_record(self, *args, **kwargs):
        _rec.pre_step(self)
        try:
            out = step(self, *args, **kwargs)
        except BaseException:
            _rec.step_failed()
            raise
        _rec.post_step(self)
        return out
    setattr(step_and_record, MARK, True)
    cls.step = step_and_record


def _wrap_scheduler_step(cls):
    step = getattr(cls, "step", None)
    if callable(step) and not getattr(step, MARK, False):
        cls.step = _wrap(step, after=lambda self, *rest: _rec.scheduler_stepped(self))


# --- what to hash -------------------------------------------------------------------------------------

def _instance_dict(o):
    try:
        d = object.__getattribute__(o, "__dict__")   # no __getattr__ of a proxy object runs
    except Exception:
        return None
    return d if type(d) is dict else None


def scan(opt):
    """(model, scheduler) of optimizer `opt` from every object the garbage collector tracks; each
    may be None. The model: of the modules that are no other module's child, the one holding the
    most of opt's parameters (then the fewest parameters); the scheduler: see the module docstring."""
    import torch   # the trainer has imported it: its optimizer stepped
    lrs = torch.optim.lr_scheduler
    bases = tuple(c for c in (getattr(lrs, n, None) for n in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau"))
                  if isinstance(c, type))
    module_t, optimizer_t = torch.nn.Module, torch.optim.Optimizer
    modules, schedulers, lookalikes = [], [], []
    for o in gc.get_objects():
        t = type(o)
        if t is dict or t is list or t is tuple or issubclass(t, type):
            continue
        if issubclass(t, module_t):
            modules.append(o)
            continue
        if issubclass(t, optimizer_t):
            continue
        d = _instance_dict(o)
        if d is None or d.get("optimizer") is not opt:
            continue
        if issubclass(t, bases):
            schedulers.append(o)
        elif callable(getattr(t, "state_dict", None)) and ("last_epoch" in d or hasattr(t, "get_last_lr")):
            lookalikes.append(o)
    want = {id(p) for g in opt.param_groups for p in g["params"]}
    children = set()
    for m in modules:
        for c in ((_instance_dict(m) or {}).get("_modules") or {}).values():
            children.add(id(c))
    best, best_key = None, None
    for m in modules:
        if id(m) in children or "_modules" not in (_instance_dict(m) or {}):
            continue
        params = list(m.parameters())
        held = sum(1 for p in params if id(p) in want)
        if held and (best_key is None or (-held, len(params)) < best_key):
            best, best_key = m, (-held, len(params))
    while best is not None:
        subs = _instance_dict(best)["_modules"]
        inner = subs.get("_orig_mod") or subs.get("module")   # torch.compile, DistributedDataParallel
        if inner is None:
            break
        best = inner
    found = schedulers or lookalikes
    nested = {id(s) for f in found for s in ((_instance_dict(f) or {}).get("_schedulers") or ())}
    outer = [s for s in found if id(s) not in nested]
    outer.sort(key=lambda s: type(s).__name__)   # several on one optimizer: by type name, stable across runs
    return best, (outer[0] if outer else None)


class _Recorder:
    """Counts the followed optimizer's steps and writes the records."""

    def __init__(self, where, first, before):
        self.where, self.first, self.before = where, first, before
        self.steps = 0               # steps of the followed optimizer(s) so far in this process
        self.after_load = False      # a load happened since the last followed step
        self.before_done = set()     # iterations with a before_step record
        self.off = False
        self.lock = threading.RLock()
        self.local = threading.local()   # .depth: optimizer steps running in this thread (nested super().step())
        self.opt = None              # weakref of the followed optimizer
        self.targets = None          # (model weakref or None, scheduler weakref or None)
        self.pending = None          # (iteration, rows): a step record awaiting the scheduler's step
        self.told_other = False

    def fail(self, what):
        if not self.off:
            self.off = True
            say("%s; recording stopped" % what)

    # hooks, each guarded: nothing of ours ever raises into the trainer

    def pre_step(self, opt):
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth or self.off:
            return
        with self.lock:
            try:
                if not self._follow(opt):
                    return
                self._flush()
                it = self.first + self.steps
                if (self.after_load or it == self.before) and it not in self.before_done:
                    self.before_done.add(it)
                    self._write("before_step", it, self._rows(opt))
                self.after_load = False
            except Exception as e:
                self.fail("before step: %s" % _line(e))

    def step_failed(self):
        self.local.depth = max(0, getattr(self.local, "depth", 1) - 1)

    def post_step(self, opt):
        depth = max(0, getattr(self.local, "depth", 1) - 1)
        self.local.depth = depth
        if depth or self.off:
            return
        with self.lock:
            try:
                if self.opt is None or self.opt() is not opt:
                    return
                it = self.first + self.steps
                self.steps += 1
                rows = self._rows(opt)
                sched = self._targets(opt)[1]
                if sched is not None and getattr(type(sched).step, MARK, False):
                    self.pending = (it, rows)
                else:
                    self._write("step", it, rows)
            except Exception as e:
                self.fail("after step: %s" % _line(e))

    def scheduler_stepped(self, sched):
        if self.off or self.pending is None:
            return
        with self.lock:
            try:
                opt = self.opt() if self.opt is not None else None
                if opt is None or self._targets(opt)[1] is not sched:
                    return
                it, rows = self.pending
                self.pending = None
                fresh = []
                probe._scheduler_rows(sched, fresh)
                probe._param_group_rows(opt, probe._labels(self._targets(opt)[0], opt), fresh)
                at = next(i for i, r in enumerate(rows) if r[0].startswith(_HEAD))
                keep = [r for r in rows if not r[0].startswith(_HEAD)]
                self._write("step", it, keep[:at] + fresh + keep[at:])
            except Exception as e:
                self.fail("after the scheduler's step: %s" % _line(e))

    def loading(self, *args):
        if self.off:
            return
        with self.lock:
            try:
                self._flush()
            except Exception as e:
                self.fail("before a load: %s" % _line(e))

    def loaded(self, *args):
        self.after_load = True

    def at_exit(self):
        if not self.off:
            try:
                self._flush()
            except Exception as e:
                self.fail("at exit: %s" % _line(e))

    # the work

    def _follow(self, opt):
        """Whether opt is the followed optimizer; the first to step (or the first after the followed
        one is gone) becomes it."""
        cur = self.opt() if self.opt is not None else None
        if cur is opt:
            return True
        if cur is None:
            self._flush()
            self.opt, self.targets = weakref.ref(opt), None
            return True
        if not self.told_other:
            self.told_other = True
            say("a second optimizer (%s) steps too: recording only the first (%s)" % (type(opt).__name__,
                                                                                       type(cur).__name__))
        return False

    def _targets(self, opt):
        """(model, scheduler) of opt, scanned once per optimizer (again if one was collected)."""
        t = self.targets
        if t is not None:
            model = t[0]() if t[0] is not None else None
            sched = t[1]() if t[1] is not None else None
            if (model is None) == (t[0] is None) and (sched is None) == (t[1] is None):
                return model, sched
        model, sched = scan(opt)
        if sched is not None:
            _wrap_scheduler_step(type(sched))
        self.targets = (weakref.ref(model) if model is not None else None,
                        weakref.ref(sched) if sched is not None else None)
        return model, sched

    def _rows(self, opt):
        model, sched = self._targets(opt)
        return probe._state(model, opt, sched, None, None, with_batch=False)

    def _flush(self):
        if self.pending is not None:
            it, rows = self.pending
            self.pending = None
            self._write("step", it, rows)

    def _write(self, event, it, rows):
        probe._write(self.where, {"event": event, "iteration": it, "metrics": [], "state": rows})
