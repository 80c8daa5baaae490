#!/usr/bin/env python3
"""Independent numpy computation of TransformerEngine FusedAdam's scalar rules, for
tests/optim/test_te_numerics.cpp (which compares the harness's values with this file's output).

  te_reference.py OUT.json

- bias correction (adam.cu, multi_tensor_adam*_cuda): float32(1 - float64(float32(beta))**t)
- scaling (fused_adam.py _apply_scale, utils.cuh reciprocal, dequantize_fp8.cuh): scale =
  f32(amax / range); fp16 rscale = 1/scale; fp8 qscale = 1/scale, scale_inv = 1/qscale
- the fp32-policy round trip (bench/scale_roundtrip.h) on every 257th amax (odd: a power-of-two stride would keep the low mantissa bits of amax at 0) in [1, 2): the counts
  of amax values whose scale, scale_inv or codes change. fp16 codes through numpy's float16
  cast, E4M3 by nearest-value search over its 127 magnitudes (ties to even, saturating).
"""
import json
import sys

import numpy as np

f32 = np.float32


def bits(x):
    return int(np.asarray(x, dtype=np.float32).view(np.uint32))


def e4m3_values():
    v = []
    for c in range(127):
        e, m = c >> 3, c & 7
        v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v, dtype=np.float64)


E4 = e4m3_values()


def e4m3_encode(x):
    """x: float32 array of non-negative values -> codes (int64)."""
    x = x.astype(np.float64)
    lo = np.clip(np.searchsorted(E4, x, side="right") - 1, 0, 126)
    hi = np.minimum(lo + 1, 126)
    dlo, dhi = x - E4[lo], E4[hi] - x
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.where(x >= 448.0, 126, code)


def roundtrip_counts(fp8, stride):
    R = f32(448.0) if fp8 else f32(32752.0)
    u = np.arange(0x3F800000, 0x40000000, stride, dtype=np.uint32)
    a = u.view(np.float32)
    s = (a / R).astype(np.float32)
    mult = (f32(1) / s).astype(np.float32)
    sinv = (f32(1) / mult).astype(np.float32) if fp8 else s
    if fp8:
        top = e4m3_encode((a * mult).astype(np.float32))
        topv = E4[top].astype(np.float32)
        probe = np.arange(1, 0x7E)
        pv = E4[probe].astype(np.float32)
    else:
        top16 = (a * mult).astype(np.float32).astype(np.float16)
        topv = top16.astype(np.float32)
        probe = np.concatenate([np.arange(1, 0x77FF - 64, 64), np.arange(0x77FF - 64, 0x77FF)]).astype(np.uint16)
        pv = probe.view(np.float16).astype(np.float32)
    umax = (topv * sinv).astype(np.float32)
    s2 = (umax / R).astype(np.float32)
    mult2 = (f32(1) / s2).astype(np.float32)
    sinv2 = (f32(1) / mult2).astype(np.float32) if fp8 else s2
    changed = np.zeros(len(a), dtype=bool)
    if fp8:
        changed |= e4m3_encode((umax * mult2).astype(np.float32)) != top
    else:
        changed |= (umax * mult2).astype(np.float32).astype(np.float16).view(np.uint16) != top16.view(np.uint16)
    for c, v in zip(probe, pv):
        x2 = ((v * sinv).astype(np.float32) * mult2).astype(np.float32)
        if fp8:
            changed |= e4m3_encode(x2) != c
        else:
            changed |= x2.astype(np.float16).view(np.uint16) != c
    return {
        "amax_values": int(len(a)),
        "scale_changed": int(np.sum(s.view(np.uint32) != s2.view(np.uint32))),
        "scale_inv_changed": int(np.sum(sinv.view(np.uint32) != sinv2.view(np.uint32))),
        "codes_changed": int(np.sum(changed)),
    }


def main():
    b1, b2 = f32(0.9), f32(0.95)
    out = {"bias_correction": [], "roundtrip_stride": 257}
    for t in range(1, 11):
        out["bias_correction"].append({
            "step": t,
            "bc1": bits(f32(1.0 - np.float64(b1) ** t)),
            "bc2": bits(f32(1.0 - np.float64(b2) ** t)),
            "bc1_from_double_beta": bits(f32(1.0 - 0.9 ** t)),
        })
    out["roundtrip"] = {"fp16": roundtrip_counts(False, 257), "fp8": roundtrip_counts(True, 257)}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
