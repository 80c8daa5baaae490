#!/usr/bin/env python3
"""Independent computation of Megatron's distributed-optimizer buffer layout, for
tests/optim/test_optim_shard_layout.cpp (which compares ShardLayout with this file's output).

  megatron_layout_reference.py OUT.json

Transliterated, with plain Python ints, from Megatron-LM main @d98e8a64ddf34856e74b24714e3bedb2f5a39553:
  megatron/core/optimizer/param_layout.py        pad_to_divisor, pad_param_start,
                                                  bucket_end_divisor, pad_bucket_end
  megatron/core/optimizer/distrib_optimizer.py   DistributedOptimizer._compute_per_buffer_param_layout,
                                                  _build_model_gbuf_range,
                                                  _build_model_gbuf_param_range_map
The shared-embedding bucket split is left out (the harness's models have no shared embedding).
Then a slow walk, element by element, of every rank's ranges gives each param's piece per rank.
"""
import json
import math
import sys


def pad_to_divisor(value, divisor):
    return int(math.ceil(value / divisor) * divisor)


def pad_param_start(i):
    return pad_to_divisor(i, 64)


def bucket_end_divisor(dp, busbw):
    return math.lcm(dp, 128, 2 ** 16) if busbw else math.lcm(dp, 128)


def compute_layout(numels, bucket_size, dp, busbw):
    """_compute_per_buffer_param_layout: params are indices into numels, in model order."""
    params = list(range(len(numels)))
    index_map, bucket_indices, numel_unpadded = {}, [], []
    param_start = bucket_start = 0
    bucket_params = set()
    bucket_id = 0
    param_end = 0

    def finalize(param_end, bucket_start, bucket_id):
        numel_unpadded.append(param_end - bucket_start)
        end = pad_to_divisor(param_end, bucket_end_divisor(dp, busbw))
        bucket_indices.append((bucket_start, end))
        return end, bucket_id + 1

    for p in params[::-1]:
        param_start = pad_param_start(param_start)
        param_end = param_start + numels[p]
        index_map[p] = (param_start, param_end, bucket_id)
        bucket_params.add(p)
        if bucket_size is not None and (param_end - bucket_start) >= bucket_size:
            bucket_start, bucket_id = finalize(param_end, bucket_start, bucket_id)
            bucket_params = set()
            param_start = bucket_start
        else:
            param_start = param_end
    if len(bucket_params) > 0:
        finalize(param_end, bucket_start, bucket_id)
    return index_map, bucket_indices, numel_unpadded


def rank_ranges(bucket_indices, dp, rank):
    """_build_model_gbuf_range: rank r's range of every bucket (world indices)."""
    out = []
    for (b, e) in bucket_indices:
        size = e - b
        assert size % dp == 0
        n = size // dp
        out.append((b + rank * n, min(size, rank * n + n) + b))
    return out


def pieces(index_map, bucket_indices, dp, rank):
    """_build_model_gbuf_param_range_map, as a slow walk over every owned element."""
    owned = set()
    for (lo, hi) in rank_ranges(bucket_indices, dp, rank):
        owned.update(range(lo, hi))
    out = {}
    for p, (s, e, _) in index_map.items():
        mine = [j for j in range(s, e) if j in owned]
        if mine:
            assert mine == list(range(mine[0], mine[-1] + 1)), "a piece must be contiguous"
            out[p] = (mine[0] - s, mine[-1] + 1 - s)
        else:
            out[p] = (0, 0)
    return out


CASES = [
    # numels (model order), bucket_size (None: one bucket), dp, pad_for_high_nccl_busbw
    ([10], None, 1, False),
    ([10], None, 3, False),
    ([7, 1, 9, 4], None, 2, False),
    ([7, 1, 9, 4], None, 4, False),
    ([5, 3, 5], None, 4, False),
    ([3], None, 5, False),
    ([100, 28, 3001, 17], None, 3, False),
    ([100, 28, 3001, 17], 200, 3, False),
    ([4096, 4096, 1], None, 8, False),
    ([4096, 4096, 1], 4096, 8, False),
    ([65, 63, 64, 1, 130, 2000], 128, 2, False),
    ([65, 63, 64, 1, 130, 2000], 300, 6, False),
    ([1000, 1000, 1000], 1500, 2, True),
    ([257, 31, 999, 64, 64, 5], 100, 2, False),
]


def main():
    out = []
    for numels, bucket_size, dp, busbw in CASES:
        index_map, buckets, numel_unpadded = compute_layout(numels, bucket_size, dp, busbw)
        case = {
            "numels": numels, "bucket_size": bucket_size or 0, "dp": dp, "busbw": busbw,
            "offsets": [index_map[p][0] for p in range(len(numels))],
            "bucket_of": [index_map[p][2] for p in range(len(numels))],
            "buckets": [list(b) for b in buckets],
            "per_bucket_numel_unpadded": numel_unpadded,
            "pieces": [],
        }
        for r in range(dp):
            pc = pieces(index_map, buckets, dp, r)
            case["pieces"].append([list(pc[p]) for p in range(len(numels))])
        out.append(case)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
