#!/usr/bin/python3
"""stranger_trainer.py: a trainer nobody on resume-harness wrote, for testing the external check
against habits not ours. It imitates nanoGPT-style scripts: a flat script, a dict of defaults
overridden by key=value tokens, iterations from 1, `step N | loss L, lr R | T ms` lines with a
measured wall time, out_dir/ckpt_<i>.pt holding the whole config (paths and all), the next batch a
pure function of (seed, i) instead of a loader position, and `import random` with Python's random
never seeded nor used. Not an example to follow: examples/tiny_lm/train.py is ours.

    /usr/bin/python3 tests/external/stranger_trainer.py out_dir=DIR max_iters=20 save_interval=10
    /usr/bin/python3 tests/external/stranger_trainer.py out_dir=DIR2 max_iters=20 save_interval=10 \\
        init_from=resume load_dir=DIR

Keys (the type of the default parses the value; bools are True/False; an unknown key or a bad
value is a one-line error on stderr, exit 2):
  out_dir="out"        where ckpt_<i>.pt goes (after step i when i % save_interval == 0, and at max_iters)
  init_from="scratch"  or "resume": load the highest ckpt_<i>.pt in load_dir, go on at iter_num+1
  load_dir=""          where to resume from ("" = out_dir)
  max_iters=20  save_interval=10  lr_decay_iters=20 (the cosine horizon, fixed: a run stopped at K
  has the schedule of a run to N)  warmup_iters=4  learning_rate=1e-2  min_lr=1e-3
  weight_decay=0.1  beta1=0.9  beta2=0.95  dropout=0.1  n_embd=32  vocab_size=64  block_size=16
  batch_size=8  seed=1234 (the data's; the weights and dropout come from torch.manual_seed(1337))
  probe=False          call rhckpt.probe.after_load / after_step (records only with RH_PROBE_DIR)
  record_host=False    also store run_info {started_at, host} in each checkpoint (varies by run)
  noise=False          a stand-in for GPU nondeterminism: loss += 1e-5 * n * loss, n from a generator
                       seeded by the name of out_dir's parent (the harness's run directory:
                       uninterrupted_1, interrupted, resumed), so runs differ yet each reruns alike
  bug=""               one resume bug: repeat_step (resume at iter_num, step K twice),
                       lossy_moments (exp_avg, exp_avg_sq saved as float16), optimizer_by_position
                       (resumed optimizer built with fc1/fc2 swapped before load_state_dict),
                       eval_after_resume (an evaluation after loading leaves model.eval()),
                       unseeded_noise (loss += 1e-6 * n * loss, n from an os.urandom-seeded generator)
When the loaded iteration equals max_iters nothing is trained and ckpt_<max_iters>.pt is written
again from what was loaded (the harness's round trip).
"""
import math
import os
import random  # noqa: F401  imported, never seeded, never used: an RNG stream that must not matter
import re
import socket
import sys
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

BUGS = ("", "repeat_step", "lossy_moments", "optimizer_by_position", "eval_after_resume", "unseeded_noise")


def die(msg):
    print("stranger_trainer.py: error: %s" % msg, file=sys.stderr)
    sys.exit(2)


# -----------------------------------------------------------------------------
config = dict(out_dir="out", init_from="scratch", load_dir="", max_iters=20, save_interval=10,
              lr_decay_iters=20, warmup_iters=4, learning_rate=1e-2, min_lr=1e-3, weight_decay=0.1,
              beta1=0.9, beta2=0.95, dropout=0.1, n_embd=32, vocab_size=64, block_size=16, batch_size=8,
              seed=1234, probe=False, record_host=False, noise=False, bug="")
for arg in sys.argv[1:]:
    key, eq, val = arg[2:].partition("=") if arg.startswith("--") else arg.partition("=")
    if not eq:
        die("'%s' is not key=value" % arg)
    if key not in config:
        die("unknown config key '%s'" % key)
    kind = type(config[key])
    try:
        if kind is bool:
            if val not in ("True", "False"):
                raise ValueError
            config[key] = val == "True"
        else:
            config[key] = kind(val)
    except ValueError:
        die("%s=%s: expected %s" % (key, val, "True or False" if kind is bool else "a" + ("n " if kind is int else " ") + kind.__name__))
if config["init_from"] not in ("scratch", "resume"):
    die("init_from must be scratch or resume, not '%s'" % config["init_from"])
if config["bug"] not in BUGS:
    die("unknown bug '%s' (valid: %s)" % (config["bug"], ", ".join(BUGS[1:])))
if config["max_iters"] < 0 or config["save_interval"] < 1 or config["lr_decay_iters"] <= config["warmup_iters"]:
    die("need max_iters >= 0, save_interval >= 1, lr_decay_iters > warmup_iters")
if min(config["n_embd"], config["vocab_size"], config["block_size"], config["batch_size"]) < 1 \
        or not 0.0 <= config["dropout"] < 1.0:
    die("n_embd, vocab_size, block_size, batch_size must be >= 1 and dropout in [0, 1)")
bug = config["bug"]
load_dir = config["load_dir"] or config["out_dir"]
# -----------------------------------------------------------------------------

torch.manual_seed(1337)


class MLP(nn.Module):
    """tokens (B, T) -> logits (B, T, V); fc1 and fc2 both (d, d) so a position mix-up goes unnoticed."""

    def __init__(self, V, d, dropout):
        super().__init__()
        self.wte = nn.Embedding(V, d)
        self.fc1 = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(d, d)
        self.lm_head = nn.Linear(d, V)

    def forward(self, idx):
        h = self.drop(F.gelu(self.fc1(self.wte(idx))))
        return self.lm_head(F.gelu(self.fc2(h)))


def get_batch(i):
    """The batch of iteration i: a pure function of (seed, i); targets a fixed noisy token map."""
    g = torch.Generator().manual_seed(config["seed"] * 100003 + i)
    B, T, V = config["batch_size"], config["block_size"], config["vocab_size"]
    x = torch.randint(0, V, (B, T), generator=g)
    flip = torch.rand(B, T, generator=g) < 0.1
    y = torch.where(flip, torch.randint(0, V, (B, T), generator=g), (5 * x + 3) % V)
    return x, y


def lr_factor(step):   # step = scheduler steps taken so far; the lr of iteration step+1
    if step < config["warmup_iters"]:
        return (step + 1) / config["warmup_iters"]
    ratio = min(1.0, (step - config["warmup_iters"]) / (config["lr_decay_iters"] - config["warmup_iters"]))
    lo = config["min_lr"] / config["learning_rate"]
    return lo + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - lo)


def configure_optimizer(model, swap=False):
    named = dict(model.named_parameters())
    order = list(named)
    if swap:   # the bug: the same-shape layers listed the other way round
        order = [n.replace("fc1", "fc#").replace("fc2", "fc1").replace("fc#", "fc2") for n in order]
    decay = [named[n] for n in order if named[n].dim() >= 2]
    no_decay = [named[n] for n in order if named[n].dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=config["learning_rate"], betas=(config["beta1"], config["beta2"]))


model = MLP(config["vocab_size"], config["n_embd"], config["dropout"])
optimizer = configure_optimizer(model)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
probe = None
if config["probe"]:
    from rhckpt import probe
noise = None
noise_scale = 1e-6
if bug == "unseeded_noise":
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
elif config["noise"]:
    run_name = os.path.basename(os.path.dirname(os.path.abspath(config["out_dir"])))
    noise = torch.Generator().manual_seed(zlib.crc32(run_name.encode()))
    noise_scale = 1e-5
run_info = {"started_at": time.time(), "host": socket.gethostname()}

iter_num = 0
if config["init_from"] == "resume":
    found = [int(m.group(1)) for m in (re.fullmatch(r"ckpt_(\d+)\.pt", n)
                                       for n in (os.listdir(load_dir) if os.path.isdir(load_dir) else [])) if m]
    if not found:
        die("%s: no ckpt_<i>.pt to resume from" % load_dir)
    path = os.path.join(load_dir, "ckpt_%d.pt" % max(found))
    try:
        checkpoint = torch.load(path, map_location="cpu")
        iter_num = int(checkpoint["iter_num"])
        if iter_num > config["max_iters"]:
            die("%s holds iteration %d, past max_iters=%d" % (path, iter_num, config["max_iters"]))
        model.load_state_dict(checkpoint["model"])
        if bug == "optimizer_by_position":
            optimizer = configure_optimizer(model, swap=True)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        osd = checkpoint["optimizer"]
        for st in osd["state"].values():
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    st[k] = st[k].float()
        optimizer.load_state_dict(osd)
        scheduler.load_state_dict(checkpoint["scheduler"])
        torch.set_rng_state(checkpoint["torch_rng"])
    except Exception as e:   # any unreadable checkpoint: one line, exit 2
        die("%s: %s: %s" % (path, type(e).__name__, (str(e).strip().splitlines() or [""])[0]))
    if bug == "eval_after_resume":   # a quick look at the loaded model; model.train() forgotten
        model.eval()
        with torch.no_grad():
            x, y = get_batch(0)
            val = F.cross_entropy(model(x).view(-1, config["vocab_size"]), y.view(-1))
        print("resumed from %s: val loss %.4f" % (path, val.item()), flush=True)
    if probe:
        probe.after_load(iter_num, model, optimizer, scheduler)


def save(i):
    osd = optimizer.state_dict()
    if bug == "lossy_moments":   # state_dict() shares the live state's dicts: copy before casting
        osd = dict(osd, state={k: {n: (t.half() if n in ("exp_avg", "exp_avg_sq") else t) for n, t in st.items()}
                               for k, st in osd["state"].items()})
    ck = {"model": model.state_dict(), "optimizer": osd, "scheduler": scheduler.state_dict(),
          "iter_num": i, "config": dict(config), "torch_rng": torch.get_rng_state()}
    if config["record_host"]:
        ck["run_info"] = run_info
    path = os.path.join(config["out_dir"], "ckpt_%d.pt" % i)
    try:
        torch.save(ck, path + ".tmp")
        os.replace(path + ".tmp", path)
    except OSError as e:
        die("%s: %s" % (path, e))


try:
    os.makedirs(config["out_dir"], exist_ok=True)
except OSError as e:
    die("out_dir=%s: %s" % (config["out_dir"], e))
start = iter_num if bug == "repeat_step" and iter_num > 0 else iter_num + 1
for i in range(start, config["max_iters"] + 1):
    t0 = time.perf_counter()
    x, y = get_batch(i)
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, config["vocab_size"]), y.view(-1))
    if noise is not None:
        loss = loss + noise_scale * torch.randn((), generator=noise) * loss
    lr = optimizer.param_groups[0]["lr"]
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    dt = time.perf_counter() - t0
    print("step %d | loss %.6f, lr %.6e | %.1fms" % (i, loss.item(), lr, dt * 1000), flush=True)
    if probe:
        probe.after_step(i, model, optimizer, scheduler, loss=loss, batch=(x, y))
    if i % config["save_interval"] == 0 or i == config["max_iters"]:
        save(i)
if start > config["max_iters"]:   # loaded iteration max_iters: nothing trained, saved as loaded
    save(config["max_iters"])
