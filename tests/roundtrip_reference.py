#!/usr/bin/env python3
"""Independent numpy prediction of what a save + load through an fp32 container does to a low-
precision optimizer state, for tests/checkpoint/test_checkpoint_roundtrip.cpp (RoundTrip.*), which compares
the states the harness restores with this file's output. Nothing here calls the harness.

  roundtrip_reference.py IN.json OUT.json

IN: {"states": [{"key", "dtype" (fp32|bf16|fp16|fp8), "bits" (the stored codes as unsigned
integers), "scale", "scale_inv", "cast" (null or the per_key value dtype), "guard"}]}
OUT: {key: {"bits": [...], "scale": float|null, "scale_inv": float|null}}

The rules, from TransformerEngine main d0067d0, transformer_engine/pytorch/optimizers/fused_adam.py:
- get_unscaled_state: fp16 `state.float() * scale`, fp8 `Float8Tensor.dequantize()` (code value
  times scale_inv, one fp32 multiply), bf16 `state.float()`.
- the save widens that value to fp32 (Megatron dp_reshardable / fully_reshardable / dp_zero);
  PR 2790's per_key first casts it to the moment's dtype without a scale: `.to(bf16|fp16)`
  (round to nearest even), and for fp8 a value copy into uint8 (x86: truncate to int32, keep the
  low byte); the load widens it back to fp32.
- set_scaled_state -> _apply_scale (lines 264-304): absmax = max(-min, max); scale =
  float32(absmax / max_range), max_range 448 (fp8) or finfo(fp16).max / 2 = 32752 (fp16);
  fp16: rscale = 1/scale where scale > 0 else 0, codes = fp16(value * rscale) (RNE);
  fp8: quantizer.scale = 1/scale, codes = E4M3(value * quantizer.scale) (RNE, saturating at
  448), scale_inv = 1/quantizer.scale; bf16: codes = bf16(value) (RNE).
- absmax of an all-zero state is +0 (IEEE 754-2019 maximum, -0 < +0, as the harness computes it);
  which zero upstream's torch.maximum(-min, max) returns depends on the device (PyTorch 1.13 on
  CPU returns the first argument, -0). Only the sign of a zero scale depends on it.
- a state that the cast zeroes (fp8 moments below 1 copied into uint8) has absmax 0: scale 0,
  quantizer.scale = inf, every value * inf = NaN, so every code is NaN and scale_inv = 0.
- guard (our scale_zero_guard option, not upstream): where 1/scale is not finite, fp8 uses 1 and
  fp16 uses 0 as the multiplier.
"""
import json
import sys

import numpy as np

f32 = np.float32


def e4m3_magnitudes():
    v = []
    for c in range(127):   # 0x7F is NaN (E4M3FN)
        e, m = c >> 3, c & 7
        v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v, dtype=np.float64)


E4 = e4m3_magnitudes()


def e4m3_encode(x):
    """float32 array -> uint8 codes: nearest magnitude by search (ties to the even code),
    saturating at 448, sign bit from the input (so -0.0 -> 0x80); NaN -> 0x7F (the GPU's NaN
    from 0 * inf has sign 0, and E4M3FN has one NaN pattern per sign)."""
    nan = np.isnan(x)
    x = np.where(nan, f32(0), x)
    a = np.abs(x.astype(np.float64))
    lo = np.clip(np.searchsorted(E4, a, side="right") - 1, 0, 126)
    hi = np.minimum(lo + 1, 126)
    dlo, dhi = a - E4[lo], E4[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= 448.0, 126, code)
    return np.where(nan, 0x7F, code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def e4m3_decode(codes):
    mag = E4[np.minimum(codes & 0x7F, 126)].astype(np.float32)
    assert not np.any((codes & 0x7F) == 0x7F), "NaN code in a test state"
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


def bf16_rne(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_value(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def decode(st):
    d = st["dtype"]
    if d == "fp32":
        return np.array(st["bits"], dtype=np.uint32).view(np.float32)
    if d == "bf16":
        return bf16_value(np.array(st["bits"], dtype=np.uint16))
    if d == "fp16":
        h = np.array(st["bits"], dtype=np.uint16).view(np.float16).astype(np.float32)
        return (h * f32(st["scale"])).astype(np.float32)
    if d == "fp8":
        return (e4m3_decode(np.array(st["bits"], dtype=np.uint8)) * f32(st["scale_inv"])).astype(np.float32)
    raise SystemExit(f"roundtrip_reference: unknown dtype {d!r}")


def cast(v, to):
    if to is None or to == "fp32":
        return v
    if to == "bf16":
        return bf16_value(bf16_rne(v))
    if to == "fp16":
        return v.astype(np.float16).astype(np.float32)
    if to == "fp8":   # value copy into uint8: truncate toward zero, keep the low byte
        assert np.all(np.abs(v) < 2.0 ** 31)
        return (np.trunc(v).astype(np.int64) & 0xFF).astype(np.float32)
    raise SystemExit(f"roundtrip_reference: unknown cast {to!r}")


def encode(v, d, guard):
    if d == "fp32":
        return {"bits": v.view(np.uint32).tolist(), "scale": None, "scale_inv": None}
    if d == "bf16":
        return {"bits": bf16_rne(v).tolist(), "scale": None, "scale_inv": None}
    absmax = f32(max(-v.min(), v.max())) if v.size else f32(0)
    if absmax == 0:   # +0, see the docstring
        absmax = f32(0.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if d == "fp16":
            scale = f32(absmax / f32(32752.0))
            r = f32(1) / scale if scale > 0 else f32(0)
            if guard and not np.isfinite(r):
                r = f32(0)
            codes = (v * r).astype(np.float32).astype(np.float16).view(np.uint16)
            return {"bits": codes.tolist(), "scale": float(scale), "scale_inv": None}
        scale = f32(absmax / f32(448.0))
        q = f32(1) / scale
        if guard and not np.isfinite(q):
            q = f32(1)
        codes = e4m3_encode((v * q).astype(np.float32))
        return {"bits": codes.tolist(), "scale": float(scale), "scale_inv": float(f32(1) / q)}


def main():
    with open(sys.argv[1]) as f:
        states = json.load(f)["states"]
    out = {}
    for st in states:
        v = cast(decode(st), st["cast"])
        out[st["key"]] = encode(v, st["dtype"], st["guard"])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
