#!/usr/bin/python3
"""megatron_like.py: a CPU trainer with Megatron-LM's command line, log line and legacy checkpoint
layout, for testing trainer.preset = "megatron" (Megatron-LM itself needs GPUs and cannot run here).

What it copies from Megatron-LM (megatron/training/, main 001b00c):
- flags --train-iters, --exit-interval (stop after an iteration that is a multiple of it, saving
  there), --save-interval, --save, --load (a directory without latest_checkpointed_iteration.txt
  means start from scratch), --log-interval, --micro-batch-size, --lr, --seed;
- the training_log line: " [2026-12-07 12:00:00.000000] iteration       10/      20 | consumed
  samples: ... | learning rate: 3.000000E-04 | global batch size: ... | lm loss: 4.771394E+00 |
  loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | ...";
- the checkpoint: SAVE/iter_0000010/mp_rank_00/model_optim_rng.pt holding args (the whole
  argparse namespace, --save and --load included), checkpoint_version, iteration, model,
  optimizer, opt_param_scheduler, rng_state (random, numpy, torch), and
  SAVE/latest_checkpointed_iteration.txt.
    /usr/bin/python3 tests/external/megatron_like.py --train-iters 20 --exit-interval 10 --save-interval 10 \\
        --save DIR --load DIR --log-interval 1 [--bug no_rng_restore]
"""
import argparse
import datetime
import os
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse(argv):
    p = argparse.ArgumentParser(prog="megatron_like.py")
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--exit-interval", type=int, default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--load", default=None)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--bug", choices=["no_rng_restore"], default=None)
    return p.parse_args(argv)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(32, 16)
        self.hidden = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.1)
        self.output = nn.Linear(16, 32)

    def forward(self, tokens):
        return self.output(self.dropout(torch.tanh(self.hidden(self.embedding(tokens)))))


def batch(seed, consumed, size):
    g = torch.Generator().manual_seed(seed * 7919 + consumed)
    tokens = torch.randint(0, 32, (size, 8), generator=g)
    return tokens, torch.roll(tokens, 1, dims=1)


def checkpoint_dir(root, iteration):
    return os.path.join(root, "iter_%07d" % iteration, "mp_rank_00")


def save(args, iteration, model, optimizer, scheduler):
    d = checkpoint_dir(args.save, iteration)
    os.makedirs(d, exist_ok=True)
    state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "opt_param_scheduler": scheduler.state_dict(),
             "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                            "torch_rng_state": torch.get_rng_state()}]}
    tmp = os.path.join(d, "model_optim_rng.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(args.save, "latest_checkpointed_iteration.txt.tmp"), "w") as f:
        f.write(str(iteration))
    os.replace(os.path.join(args.save, "latest_checkpointed_iteration.txt.tmp"),
               os.path.join(args.save, "latest_checkpointed_iteration.txt"))


def main(argv):
    args = parse(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: min(1.0, (it + 1) / 4))
    args.consumed_train_samples = 0
    iteration = 0
    tracker = os.path.join(args.load, "latest_checkpointed_iteration.txt") if args.load else ""
    if tracker and os.path.exists(tracker):
        with open(tracker) as f:
            iteration = int(f.read().strip())
        state = torch.load(os.path.join(checkpoint_dir(args.load, iteration), "model_optim_rng.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["opt_param_scheduler"])
        args.consumed_train_samples = state["args"].consumed_train_samples
        if args.bug != "no_rng_restore":
            rng = state["rng_state"][0]
            random.setstate(rng["random_rng_state"])
            np.random.set_state(rng["np_rng_state"])
            torch.set_rng_state(rng["torch_rng_state"])
        print(" successfully loaded checkpoint from %s at iteration %d" % (args.load, iteration), flush=True)
    model.train()
    while iteration < args.train_iters:
        tokens, labels = batch(args.seed, args.consumed_train_samples, args.micro_batch_size)
        loss = F.cross_entropy(model(tokens).reshape(-1, 32), labels.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        iteration += 1
        args.consumed_train_samples += args.micro_batch_size
        if iteration % args.log_interval == 0:
            now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
            print(f" [{now}] iteration {iteration:8d}/{args.train_iters:8d} | consumed samples: "
                  f"{args.consumed_train_samples:12d} | elapsed time per iteration (ms): 1.0 | learning rate: "
                  f"{lr:.6E} | global batch size: {args.micro_batch_size:5d} | lm loss: {loss.item():.6E} | "
                  f"loss scale: 1.0 | grad norm: {grad_norm:.3f} | number of skipped iterations:   0 | "
                  f"number of nan iterations:   0 |", flush=True)
        saved = False
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            save(args, iteration, model, optimizer, scheduler)
            saved = True
        if args.exit_interval and iteration % args.exit_interval == 0:
            if args.save and not saved:
                save(args, iteration, model, optimizer, scheduler)
            print(" exiting program at iteration %d" % iteration, flush=True)
            return 0
    if args.save and iteration % (args.save_interval or iteration) != 0:
        save(args, iteration, model, optimizer, scheduler)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
