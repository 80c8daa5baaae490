#!/usr/bin/python3
"""Independent numpy computation of one data-parallel training step as Megatron-LM's
DistributedDataParallel + DistributedOptimizer and TransformerEngine's FusedAdam take it, for
tests/ranks/test_dist_reference.cpp (which runs the C++ optimizer as real ranks and compares
every rank's result with this file's, bit for bit).

  dp_step_reference.py IN.json OUT.json

Written from upstream's source, not from our C++ (Megatron-LM main
@d98e8a64ddf34856e74b24714e3bedb2f5a39553, TransformerEngine main
@d0067d0da6cb01811b8072a7d304f0e00344ce2b, NCCL master
@5067397c2676d5aed50042fc39e5c8ee96eb0027):
  layout      tests/megatron_layout_reference.py (distrib_optimizer.py _compute_per_buffer_param_layout,
              _build_model_gbuf_range, _build_model_gbuf_param_range_map)
  accumulate  main_grad += grad per micro-batch, in the main grads' dtype
  scale       param_and_grad_buffer.py start_grad_sync, lines 661-667: grad_data *= 1/dp
              (gradient_scaling_factor, distributed_data_parallel.py lines 271-278), fp32
              multiply rounded to the buffer's dtype
  reduce      one SUM reduce-scatter per bucket (lines 707-723; shard_buffer, lines 69-78) in
              NCCL's ring order (src/device/reduce_scatter.h runRing, lines 39-53; ring in rank
              order): shard d is ((g[d+1] + g[d+2]) + ...) + g[d], each add rounded to the dtype
  norm        clip_grads.py get_grad_norm_fp32, lines 116-136: per rank the fp32 l2 norm of its
              shard, squared, summed over ranks (an all-reduce: the same ring, ending at rank 0),
              sqrt. The shard's own sum of squares is the harness's documented order (per param
              piece, per 4096-element block a row sum, block sums added in order): the row sums
              are the one thing computed with torch here, the same ATen kernel the harness uses
  clip        clip_grad_by_total_norm_fp32 (megatron_reference.clip_coeff), grads * coeff in fp32
              rounded to the dtype (TE multi_tensor_scale)
  zeros       count_zeros_fp32, lines 254 and 271: zeros of every shard, summed
  step        TE transformer_engine/common/multi_tensor/adam.cu AdamFunctorMaster (lines 135-141)
              and AdamFunctorMasterParamRemainder (lines 240-279) on each rank's shard, AdamW:
              m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; denom = sqrt(v/bc2) + eps;
              update = (m/bc1)/denom + wd*p; p = p - lr*update; each op one fp32 rounding (the GPU
              may contract into FMAs: not modelled, as in the harness); bc = f32(1 -
              f64(f32(beta))**t) (lines 581-584); bf16 moments stored RNE; remainders joined and
              split as the kernel does (line 242: undo the round-up when the remainder is
              negative; line 276: round up)
  all-gather  every rank's shard of the new bf16 params gathered into the full params
Floats travel as IEEE bit patterns.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_layout_reference import compute_layout, rank_ranges  # noqa: E402
from megatron_reference import clip_coeff, to_bf16  # noqa: E402

f32 = np.float32


def from_bf16_bits(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def bf16_bits(x):
    return (to_bf16(x).view(np.uint32) >> 16).astype(np.int64)


def f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)


def row_sums_4096(squares):
    """The harness's block sums (precision_adam.cpp block_square_sums), with torch."""
    import torch
    n = squares.size
    pad = (4096 - n % 4096) % 4096
    t = torch.from_numpy(np.concatenate([squares, np.zeros(pad, dtype=np.float32)]))
    return t.view(-1, 4096).sum(1).numpy()


def ring_sum(values, owner, rnd):
    dp = len(values)
    acc = values[(owner + 1) % dp].astype(np.float32)
    for j in range(2, dp + 1):
        acc = rnd(acc + values[(owner + j) % dp])
    return acc


def main():
    cfg = json.load(open(sys.argv[1]))
    dp = cfg["world"]
    shapes = cfg["shapes"]
    numels = [int(np.prod(s)) for s in shapes]
    n_params = len(numels)
    bf16_grads = cfg["main_grads"] == "bf16"
    rnd = (lambda x: to_bf16(x).reshape(np.shape(x))) if bf16_grads else (lambda x: np.asarray(x, np.float32))
    bf16_moments = cfg["moments"] == "bf16"
    remainders = cfg["remainders"]
    beta1, beta2, eps = f32(cfg["beta1"]), f32(cfg["beta2"]), f32(cfg["eps"])
    # Optimizer order: the "decay" group (matrices), then "no_decay", each in model order.
    group_of = [0 if len(s) >= 2 else 1 for s in shapes]
    opt_order = [i for g in (0, 1) for i in range(n_params) if group_of[i] == g]
    wd = [f32(cfg["weight_decay"]), f32(0.0)]

    index_map, buckets, _ = compute_layout(numels, cfg["bucket_size"] or None, dp, False)
    total = buckets[-1][1]
    ranges = [rank_ranges(buckets, dp, r) for r in range(dp)]

    def piece(i, r):
        s, e, b = index_map[i]
        lo, hi = ranges[r][b]
        a, z = max(s, lo), min(e, hi)
        return (a - s, z - s) if a < z else (0, 0)

    params = [from_bf16_bits(b).copy() for b in cfg["params"]]   # bf16 values, full, every rank
    state = []   # state[r][i]: master (fp32 or remainder int32), m, v of rank r's piece
    for r in range(dp):
        per = []
        for i in range(n_params):
            a, z = piece(i, r)
            master = np.zeros(z - a, np.int32) if remainders else params[i][a:z].copy()
            per.append([master, np.zeros(z - a, np.float32), np.zeros(z - a, np.float32)])
        state.append(per)

    out = {"norms": [], "zeros": []}
    for t, step in enumerate(cfg["steps"], start=1):
        # Each rank's buffer: accumulate, scale by 1/dp.
        factor = f32(1.0 / dp)
        bufs = []
        for r in range(dp):
            buf = np.zeros(total, np.float32)
            for i in range(n_params):
                mg = np.zeros(numels[i], np.float32)
                for micro in step["grads"]:
                    mg = rnd(mg + from_bf16_bits(micro[r][i]))
                s = index_map[i][0]
                buf[s:s + numels[i]] = rnd(mg * factor) if dp > 1 else mg
            bufs.append(buf)
        # Reduce-scatter per bucket.
        reduced = [np.zeros(total, np.float32) for _ in range(dp)]
        for (b, e) in buckets:
            n = (e - b) // dp
            for d in range(dp):
                lo = b + d * n
                reduced[d][lo:lo + n] = ring_sum([bufs[r][lo:lo + n] for r in range(dp)], d, rnd) if dp > 1 \
                    else bufs[0][lo:lo + n]
        shard = [[reduced[r][index_map[i][0] + piece(i, r)[0]:index_map[i][0] + piece(i, r)[1]]
                  for i in range(n_params)] for r in range(dp)]
        # Norm.
        squares = []
        for r in range(dp):
            acc = f32(0.0)
            for i in opt_order:
                g = shard[r][i]
                if g.size == 0:
                    continue
                for blk in row_sums_4096((g * g).astype(np.float32)):
                    acc = f32(acc + blk)
            s = f32(np.sqrt(acc))
            squares.append(np.array([f32(s * s)], np.float32))
        total_sq = ring_sum(squares, 0, lambda x: x)[0] if dp > 1 else squares[0][0]
        norm = f32(np.sqrt(total_sq))
        out["norms"].append(int(f32_bits(norm)))
        coeff = clip_coeff(norm, cfg["max_norm"])
        if coeff != f32(1.0):
            shard = [[rnd(g * coeff) for g in per] for per in shard]
        out["zeros"].append(int(sum(int((g == 0).sum()) for per in shard for g in per)))
        # TE's Adam step on every rank's shard, then the param all-gather.
        lr = f32(cfg["lrs"][t - 1])
        bc1 = f32(1.0 - np.float64(beta1) ** t)
        bc2 = f32(1.0 - np.float64(beta2) ** t)
        new_params = [p.copy() for p in params]
        for r in range(dp):
            for i in range(n_params):
                a, z = piece(i, r)
                if a == z:
                    continue
                master, m, v = state[r][i]
                weight = params[i][a:z]
                if remainders:   # join: undo the round-up, glue the halves
                    hi = (weight.view(np.uint32) >> 16).astype(np.int64)
                    hi = np.where(master < 0, hi - 1, hi) & 0xFFFF
                    p = ((hi << 16) | (master.astype(np.int64) & 0xFFFF)).astype(np.uint32).view(np.float32)
                else:
                    p = master
                g = shard[r][i].astype(np.float32)
                m = f32(beta1) * m + (f32(1.0) - beta1) * g
                v = f32(beta2) * v + ((f32(1.0) - beta2) * g) * g
                m, v = m.astype(np.float32), v.astype(np.float32)
                denom = (np.sqrt(v / bc2) + eps).astype(np.float32)
                update = ((m / bc1) / denom + wd[group_of[i]] * p).astype(np.float32)
                p = (p - lr * update).astype(np.float32)
                if remainders:   # split: high half rounded up when the low half is negative
                    u = p.view(np.uint32).astype(np.int64)
                    lo16 = u & 0xFFFF
                    rem = np.where(lo16 >= 0x8000, lo16 - 0x10000, lo16)
                    hi = np.where(rem < 0, (u >> 16) + 1, u >> 16) & 0xFFFF
                    new_params[i][a:z] = (hi.astype(np.uint32) << 16).view(np.float32)
                    master = rem.astype(np.int32)
                else:
                    master = p
                    new_params[i][a:z] = to_bf16(p)
                if bf16_moments:
                    m, v = to_bf16(m), to_bf16(v)
                state[r][i] = [master, m, v]
        params = new_params

    out["params"] = [bf16_bits(p).tolist() for p in params]
    out["states"] = []
    for r in range(dp):
        per = []
        for i in range(n_params):
            master, m, v = state[r][i]
            enc = bf16_bits if bf16_moments else f32_bits
            per.append({"piece": list(piece(i, r)),
                        "master": master.astype(np.int64).tolist() if remainders else f32_bits(master).tolist(),
                        "exp_avg": enc(m).tolist(), "exp_avg_sq": enc(v).tolist()})
        out["states"].append(per)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
