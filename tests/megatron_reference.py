#!/usr/bin/python3
"""Independent numpy computations of two Megatron rules the tests pin (written from upstream's
Python, not from our C++):

  clip:   megatron/core/optimizer/clip_grads.py clip_grad_by_total_norm_fp32 (NVIDIA/Megatron-LM
          main d98e8a6, lines 179-191) with TE's multi_tensor_scale_tensor: an fp32 tensor
          `max_norm / (total_norm + 1.0e-6)`, which torch evaluates as
          `(total_norm + 1e-6).reciprocal() * max_norm` (Tensor.__rtruediv__), clamped to 1.
  z_loss: megatron/core/transformer/moe/moe_utils.py z_loss_func (lines 153-182),
          `mean(square(logsumexp(logits))) * coeff` in the logits' dtype, each op as CUDA runs it:
          elementwise in fp32 rounded to the dtype, sums accumulated in fp32 and rounded once,
          logsumexp as ATen's composite (amax, sub, exp, sum, log, add), mean as
          sum * (1 / n) in the accumulation type (CUDA mean_kernel_impl).

Writes JSON to argv[1]: float results as their IEEE bit patterns (uint32 / uint64)."""
import json
import sys

import numpy as np

f32 = np.float32


def bits32(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def bits64(x):
    return int(np.array([x], dtype=np.float64).view(np.uint64)[0])


def to_bf16(x):
    """Round float32 values to bfloat16 (nearest, ties to even), returned as float32."""
    a = np.atleast_1d(np.asarray(x, dtype=np.float32)).copy()
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    nan = np.isnan(a)
    out[nan] = a[nan]
    return out


def clip_coeff(norm, max_norm):
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = f32(norm) + f32(1.0e-6)
        c = (f32(1.0) / denom) * f32(max_norm)
    return f32(min(c, f32(1.0))) if not np.isnan(c) else c


def z_loss(rows, coeff, dtype):
    x = np.array(rows, dtype=np.float64 if dtype == "fp64" else np.float32)
    hold = (lambda t: to_bf16(t).reshape(np.shape(t))) if dtype == "bf16" else (lambda t: t)
    x = hold(x)
    m = x.max(axis=-1, keepdims=True)
    m[np.isinf(m)] = 0
    e = hold(np.exp(hold(x - m)))
    s = np.array([sum(r[1:], r[0]) for r in e])          # left-to-right, in the working type
    lse = hold(hold(np.log(hold(s))) + m[:, 0])
    sq = hold(lse * lse)
    total = sq[0]
    for v in sq[1:]:
        total = total + v
    work = np.float64 if dtype == "fp64" else np.float32
    factor = work(1.0) / work(len(sq))
    z = hold(np.array([hold(np.array([total * factor]))[0] * work(coeff)], dtype=work))[0]
    return z


def main():
    out = {"clip": [], "z_loss": []}
    one = f32(1.0)
    norms = [0.0, 0.5, 0.999999, 1.0, np.nextafter(one, f32(0)), np.nextafter(one, f32(2)),
             1.0 - 1e-6, 1.0 - 2e-6, 1.0000001, 1.5, 3.0, 7.25, 123.456, 1e6, float("inf"), float("nan")]
    for max_norm in (1.0, 0.5, 2.5, 0.3):
        for n in norms + [max_norm, max_norm * 1.0000001, max_norm - 1e-6]:
            n32 = f32(n)
            out["clip"].append({"norm_bits": bits32(n32), "max_norm": max_norm,
                                "coeff_bits": bits32(clip_coeff(n32, max_norm))})
    # The logits of tests/models/test_model_moe.cpp's hand-computed case, and a wider one.
    cases = {
        "hand": [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0], [0.0, 1.0, -2.0, 3.0]],
        "wide": [[0.25 * ((7 * i + 3 * j) % 11) - 1.5 for j in range(8)] for i in range(5)],
    }
    for name, rows in cases.items():
        for dtype in ("bf16", "fp32", "fp64"):
            z = z_loss(rows, 1e-3, dtype)
            entry = {"case": name, "dtype": dtype, "rows": rows, "coeff": 1e-3}
            if dtype == "fp64":
                entry["z_bits64"] = bits64(z)
            else:
                entry["z_bits"] = bits32(z)
            out["z_loss"].append(entry)
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
