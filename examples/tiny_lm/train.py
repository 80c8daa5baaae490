#!/usr/bin/python3
"""tiny_lm: a small deterministic PyTorch language-model trainer (CPU, about 2 s for 20
iterations) whose checkpoints resume bit-exactly, plus switches that reproduce one classic resume
bug each. resume-harness's "check any trainer" runs it as a user's own training command.

    /usr/bin/python3 examples/tiny_lm/train.py --iters N --save-every K --out DIR
        [--load DIR | --resume] [--bug NAME] [--probe] [--metrics-jsonl FILE] [--log-digits D] [--seed S]

Everything a step depends on is in the checkpoint (DIR/iter_<i>.pt): model, AdamW, LambdaLR
(warmup + cosine over a fixed --decay-iters, so a run stopped at K has the schedule of a run to
N), the torch / numpy / python RNG states, the loader position (epoch, micro-batches consumed in
it, the sampler generator's state at the epoch start) and the hyper-parameters as plain Python
values. See README.md for the flags and the bugs.
"""
import argparse
import json
import math
import os
import random
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

BUGS = ("rng_not_saved", "reseed_on_resume", "data_position_not_saved", "lr_scheduler_not_saved",
        "optimizer_state_not_saved", "save_mid_accumulation", "nondeterministic")
VOCAB, D_MODEL, LAYERS, HEADS, SEQ, BATCH, ACCUM, SAMPLES = 64, 32, 2, 2, 16, 8, 2, 96


class Refused(Exception):
    """A one-line error; exit 2."""


def parse(argv):
    p = argparse.ArgumentParser(prog="train.py", description="tiny_lm: a resumable PyTorch LM trainer")
    p.add_argument("--iters", type=int, required=True, help="train up to this iteration (counted from 1)")
    p.add_argument("--save-every", type=int, required=True, help="save at every multiple of K (and at --iters)")
    p.add_argument("--out", required=True, help="directory of iter_<i>.pt checkpoints")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--load", help="resume from the highest iter_<i>.pt in this directory")
    g.add_argument("--resume", action="store_true", help="resume from --out itself (start fresh if it has no checkpoint)")
    p.add_argument("--bug", help="reproduce one resume bug: " + ", ".join(BUGS))
    p.add_argument("--probe", action="store_true", help="call rhckpt.probe (records only with RH_PROBE_DIR)")
    p.add_argument("--metrics-jsonl", help="append {iteration, loss, lr} per iteration, exact JSON numbers")
    p.add_argument("--log-digits", type=int, default=6, help="decimals of the logged loss (default 6)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--decay-iters", type=int, default=20, help="cosine horizon (independent of --iters)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    a = p.parse_args(argv)
    if a.bug is not None and a.bug not in BUGS:
        raise Refused("unknown --bug '%s' (valid: %s)" % (a.bug, ", ".join(BUGS)))
    if a.iters < 0 or a.save_every < 1 or not 0 <= a.log_digits <= 30:
        raise Refused("--iters must be >= 0, --save-every >= 1, --log-digits in 0..30")
    if a.resume:
        a.load = a.out
    return a


# --- data -----------------------------------------------------------------------------------------

class TokenStream(Dataset):
    """SAMPLES windows of SEQ+1 tokens from a fixed synthetic stream (its own seed, no global RNG):
    a noisy affine recurrence, so there is something to learn."""

    def __init__(self):
        rs = np.random.RandomState(20240601)
        n = SAMPLES * SEQ + 1
        toks = np.zeros(n, dtype=np.int64)
        toks[0] = 7
        noise = rs.randint(0, 4, size=n)
        for i in range(1, n):
            toks[i] = (toks[i - 1] * 5 + 3 + noise[i]) % VOCAB
        self.tokens = torch.from_numpy(toks)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.tokens[i * SEQ:i * SEQ + SEQ + 1].clone()


class Loader:
    """A DataLoader over a RandomSampler, both drawing from one torch.Generator; the position is
    (epoch, micro-batches consumed in it, the generator's state at the epoch start)."""

    def __init__(self, seed):
        self.gen = torch.Generator()
        self.gen.manual_seed(seed + 1)
        ds = TokenStream()
        self.loader = DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds, generator=self.gen),
                                 generator=self.gen, drop_last=True)
        self.epoch, self.consumed, self.it, self.epoch_start = 0, 0, None, None

    def next(self):
        while True:
            if self.it is None:
                self.epoch_start = self.gen.get_state()
                self.it, self.consumed = iter(self.loader), 0
            try:
                batch = next(self.it)
            except StopIteration:
                self.it, self.epoch = None, self.epoch + 1
                continue
            self.consumed += 1
            return batch

    def state(self):
        start = self.epoch_start if self.it is not None else self.gen.get_state()
        return {"epoch": self.epoch, "consumed": self.consumed, "epoch_start_generator": start.clone()}

    def restore(self, s):
        """Rebuilds the epoch's permutation from the saved generator state and skips what was used
        (the dataset draws no random numbers, so skipping touches no global RNG)."""
        self.epoch = int(s["epoch"])
        self.gen.set_state(s["epoch_start_generator"])
        self.epoch_start = self.gen.get_state()
        self.it, self.consumed = iter(self.loader), 0
        for _ in range(int(s["consumed"])):
            next(self.it)
            self.consumed += 1


def augment(tokens):
    """Inputs and targets of a micro-batch. python random masks one token in about half the rows,
    numpy RNG replaces about 5% of the input tokens with token 1: both RNG states matter."""
    x, y = tokens[:, :-1].clone(), tokens[:, 1:]
    for r in range(x.shape[0]):
        if random.random() < 0.5:
            x[r, random.randrange(SEQ)] = 0
    x[torch.from_numpy(np.random.rand(*x.shape) < 0.05)] = 1
    return x, y


# --- model ----------------------------------------------------------------------------------------

class TinyLM(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 2 * D_MODEL, dropout, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("causal_mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1))

    def forward(self, x):
        h = self.drop(self.tok(x) + self.pos(torch.arange(x.shape[1])))
        return self.head(self.norm(self.blocks(h, mask=self.causal_mask)))


def lr_lambda(warmup, decay_iters):
    def f(step):   # step = optimizer steps taken so far
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, decay_iters - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


def build(a, seed):
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)
    model = TinyLM(a.dropout)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(a.warmup, a.decay_iters))
    return model, opt, sched, Loader(seed)


# --- checkpoints ------------------------------------------------------------------------------------

def hyper(a, seed):
    """The args dict saved in every checkpoint: plain Python values (torch 1.13's weights_only=True
    refuses the floats)."""
    return {"seed": seed, "lr": a.lr, "weight_decay": a.weight_decay, "warmup": a.warmup,
            "decay_iters": a.decay_iters, "dropout": a.dropout, "clip": a.clip, "vocab": VOCAB,
            "d_model": D_MODEL, "layers": LAYERS, "seq": SEQ, "batch": BATCH, "accum": ACCUM,
            "model": "tiny_lm"}


def save(path, it, a, seed, model, opt, sched, loader):
    ck = {"iteration": it, "args": hyper(a, seed), "model": model.state_dict()}
    if a.bug != "optimizer_state_not_saved":
        ck["optimizer"] = opt.state_dict()
    if a.bug != "lr_scheduler_not_saved":
        ck["scheduler"] = sched.state_dict()
    if a.bug != "rng_not_saved":
        ck["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if a.bug != "data_position_not_saved":
        ck["data"] = loader.state()
    tmp = path + ".tmp"
    torch.save(ck, tmp)
    os.replace(tmp, path)


def latest(d):
    if not os.path.isdir(d):
        raise Refused("%s: no such directory to load from" % d)
    its = [int(m.group(1)) for m in (re.fullmatch(r"iter_(\d+)\.pt", n) for n in os.listdir(d)) if m]
    if not its:
        raise Refused("%s: no iter_<i>.pt checkpoint to load" % d)
    return os.path.join(d, "iter_%d.pt" % max(its)), max(its)


def restore(a, seed, model, opt, sched, loader):
    path, _ = latest(a.load)
    ck = torch.load(path, map_location="cpu")   # our own file: plain torch.load
    model.load_state_dict(ck["model"])
    if "optimizer" in ck:
        opt.load_state_dict(ck["optimizer"])
    if "scheduler" in ck:
        sched.load_state_dict(ck["scheduler"])
    if "data" in ck:
        loader.restore(ck["data"])
    if "rng" in ck:
        torch.set_rng_state(ck["rng"]["torch"])
        np.random.set_state(ck["rng"]["numpy"])
        random.setstate(ck["rng"]["python"])
    if a.bug == "reseed_on_resume":   # the bug: a "make it reproducible" reseed after the restore
        torch.manual_seed(seed)
        np.random.seed(seed % 2 ** 32)
        random.seed(seed)
    return int(ck["iteration"])


# --- training ---------------------------------------------------------------------------------------

def train(a):
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    seed = int.from_bytes(os.urandom(4), "little") if a.bug == "nondeterministic" else a.seed
    model, opt, sched, loader = build(a, seed)
    probe = None
    if a.probe:
        from rhckpt import probe
    done = 0
    if a.resume and not any(re.fullmatch(r"iter_(\d+)\.pt", n) for n in
                            (os.listdir(a.out) if os.path.isdir(a.out) else [])):
        print("train.py: no iter_<i>.pt in %s: starting from iteration 0" % a.out, file=sys.stderr)
        a.load = None   # --resume on an empty --out starts fresh (one command line for every run)
    if a.load:
        done = restore(a, seed, model, opt, sched, loader)
        if done > a.iters:
            raise Refused("%s holds iteration %d, past --iters %d" % (a.load, done, a.iters))
        if probe:
            probe.after_load(done, model, opt, sched, state=loader.state())
    os.makedirs(a.out, exist_ok=True)
    ckpt = lambda i: save(os.path.join(a.out, "iter_%d.pt" % i), i, a, seed, model, opt, sched, loader)  # noqa: E731
    metrics = open(a.metrics_jsonl, "a") if a.metrics_jsonl else None
    for i in range(done + 1, a.iters + 1):
        saving = i % a.save_every == 0 or i == a.iters
        model.train()
        total, inputs = torch.zeros(()), []
        for m in range(ACCUM):
            x, y = augment(loader.next())
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)) / ACCUM
            loss.backward()
            total = total + loss.detach()
            inputs.append(x)
            if a.bug == "save_mid_accumulation" and m == 0 and saving:
                ckpt(i)   # the bug: saved on a micro-step, before iteration i's optimizer step
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(total)
        print("iter %d: loss %.*f lr %.6e" % (i, a.log_digits, loss_value, lr), flush=True)
        if metrics:
            metrics.write(json.dumps({"iteration": i, "loss": loss_value, "lr": lr}) + "\n")
            metrics.flush()
        if probe:
            probe.after_step(i, model, opt, sched, loss=total, batch=inputs, state=loader.state())
        if saving and a.bug != "save_mid_accumulation":
            ckpt(i)
    if done >= a.iters:   # trained nothing after loading: save what was loaded (the round trip)
        ckpt(a.iters)
    if metrics:
        metrics.close()


def main(argv):
    try:
        train(parse(argv))
        return 0
    except Refused as e:
        print("train.py: error: %s" % e, file=sys.stderr)
        return 2
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        print("train.py: error: %s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else ""),
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
