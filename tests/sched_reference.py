#!/usr/bin/env python3
"""Independent Python computation of Megatron's OptimizerParamScheduler values, for
tests/train/test_schedule.cpp (which compares the harness's values with this file's output bit for bit).

  sched_reference.py OUT.json

Written from megatron/core/optimizer_param_scheduler.py (get_lr, get_wd) and the sizing in
megatron/training/training.py (get_optimizer_param_scheduler: steps = iterations x global batch),
in plain Python floats (doubles) and the math module, as upstream computes them. Each case lists
the scheduler's values at chosen num_steps, as float.hex() strings.
"""
import json
import math
import sys


def lr(c, n):
    if c["warmup"] > 0 and n <= c["warmup"]:
        return c["init_lr"] + ((c["max_lr"] - c["init_lr"]) * float(n) / float(c["warmup"]))
    if c["style"] == "constant":
        return c["max_lr"]
    if n > c["decay"]:
        return c["min_lr"]
    if c["style"] == "inverse-square-root":
        w = max(c["warmup"], 1)
        k = max(n, 1)
        return max(c["min_lr"], c["max_lr"] * w ** 0.5 / (k ** 0.5))
    ratio = float(n - c["warmup"]) / float(c["decay"] - c["warmup"])
    assert 0.0 <= ratio <= 1.0
    delta = c["max_lr"] - c["min_lr"]
    if c["style"] == "linear":
        coeff = 1.0 - ratio
    elif c["style"] == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif c["style"] == "WSD":
        start = c["decay"] - c["wsd"]
        if n <= start:
            coeff = 1.0
        else:
            r = float(n - start) / float(c["wsd"])
            coeff = {"linear": lambda: 1.0 - r,
                     "cosine": lambda: 0.5 * (math.cos(math.pi * r) + 1.0),
                     "exponential": lambda: (2.0 * math.pow(0.5, r)) - 1.0,
                     "minus_sqrt": lambda: 1.0 - math.sqrt(r)}[c["wsd_style"]]()
    else:
        raise ValueError(c["style"])
    return c["min_lr"] + coeff * delta


def wd(c, n):
    if n > c["wd_steps"]:
        return c["end_wd"]
    if c["wd_style"] == "constant":
        assert c["start_wd"] == c["end_wd"]
        return c["end_wd"]
    ratio = float(n) / float(c["wd_steps"])
    delta = c["end_wd"] - c["start_wd"]
    coeff = ratio if c["wd_style"] == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
    return c["start_wd"] + coeff * delta


def case(name, style, wd_style="constant", wsd_style="exponential", wsd_iters=None, init_lr=0.0,
         start_wd=0.1, end_wd=0.1, warmup_iters=2, decay_iters=20, train_iters=20, gb=16):
    # training.py get_optimizer_param_scheduler: every length in samples
    return {"name": name, "max_lr": 1e-2, "min_lr": 1e-3, "init_lr": init_lr, "gb": gb,
            "warmup_iters": warmup_iters, "decay_iters": decay_iters, "train_iters": train_iters,
            "wsd_iters": -1 if wsd_iters is None else wsd_iters,
            "warmup": warmup_iters * gb, "decay": decay_iters * gb,
            "wsd": None if wsd_iters is None else wsd_iters * gb,
            "style": style, "wsd_style": wsd_style, "start_wd": start_wd, "end_wd": end_wd,
            "wd_style": wd_style, "wd_steps": train_iters * gb}


CASES = [
    case("constant", "constant"),
    case("linear", "linear", wd_style="linear", start_wd=0.0, end_wd=0.1),
    case("cosine", "cosine", wd_style="cosine", start_wd=0.01, end_wd=0.1, init_lr=1e-4),
    case("isqrt", "inverse-square-root"),
    case("isqrt-no-warmup", "inverse-square-root", warmup_iters=0),
    case("wsd-exponential", "WSD", wsd_iters=5),
    case("wsd-linear", "WSD", wsd_style="linear", wsd_iters=5),
    case("wsd-cosine", "WSD", wsd_style="cosine", wsd_iters=8),
    case("wsd-minus-sqrt", "WSD", wsd_style="minus_sqrt", wsd_iters=7, decay_iters=18),
    case("decay-shorter-than-run", "cosine", wd_style="linear", start_wd=0.0, end_wd=0.2, decay_iters=12,
         train_iters=20),
]


def main():
    out = []
    for c in CASES:
        # every iteration's step (num_steps = (i - 1) x gb for iterations 1..N+2) and a few odd counts
        ns = sorted(set([i * c["gb"] for i in range(0, c["train_iters"] + 3)] + [1, 7, 33, c["decay"] - 1, c["decay"] + 1]))
        vals = [{"num_steps": n, "lr": lr(c, n).hex(), "wd": wd(c, n).hex()} for n in ns]
        out.append({k: v for k, v in c.items() if k not in ("warmup", "decay", "wsd", "wd_steps")} | {"values": vals})
    with open(sys.argv[1], "w") as f:
        json.dump({"cases": out}, f, indent=1)


if __name__ == "__main__":
    main()
