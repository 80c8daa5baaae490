#!/usr/bin/env python3
"""TransformerEngine's FusedAdam on a GPU, for tests/optim/test_optim_te_gpu.cpp.

Reads IN_DIR/case.json and the raw little-endian arrays it names (written by the C++ test), runs
`transformer_engine.pytorch.optimizers.FusedAdam` as Megatron's precision-aware distributed
optimizer drives it (master_weights, decoupled fp32 grads, the configured state dtypes), and
writes the param and every state after each step to OUT_DIR as raw arrays plus out.json.
Exit 77 (CTest's skip) when CUDA or TransformerEngine is missing."""
import json
import os
import sys

import numpy as np


def main():
    in_dir, out_dir = sys.argv[1], sys.argv[2]
    try:
        import torch
        if not torch.cuda.is_available():
            print("skip: no CUDA device")
            return 77
        from transformer_engine.pytorch.optimizers import FusedAdam
    except ImportError as e:
        print(f"skip: {e}")
        return 77
    with open(os.path.join(in_dir, "case.json")) as fh:
        case = json.load(fh)
    n = case["numel"]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}
    init = np.fromfile(os.path.join(in_dir, "param.f32"), dtype=np.float32, count=n)
    param = torch.nn.Parameter(torch.from_numpy(init).cuda().to(torch.bfloat16))
    opt = FusedAdam([param], lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                    weight_decay=case["weight_decay"], adam_w_mode=True, master_weights=True,
                    master_weight_dtype=torch.float32, exp_avg_dtype=dtypes[case["exp_avg"]],
                    exp_avg_sq_dtype=dtypes[case["exp_avg_sq"]], use_decoupled_grad=True,
                    store_param_remainders=case["remainders"])
    out = {"steps": []}
    for s in range(case["steps"]):
        g = np.fromfile(os.path.join(in_dir, f"grad{s}.f32"), dtype=np.float32, count=n)
        param.decoupled_grad = torch.from_numpy(g).cuda()
        for group in opt.param_groups:
            group["lr"] = case["lr"]
        opt.step()
        files = {}
        param.detach().float().cpu().numpy().tofile(os.path.join(out_dir, f"param{s}.f32"))
        files["param"] = f"param{s}.f32"
        for key in ("exp_avg", "exp_avg_sq", "master_param"):
            v = opt.get_unscaled_state(param, key)
            if v.dtype == torch.int16:
                v.cpu().numpy().astype(np.int16).tofile(os.path.join(out_dir, f"{key}{s}.i16"))
                files[key] = f"{key}{s}.i16"
            else:
                v.float().cpu().numpy().tofile(os.path.join(out_dir, f"{key}{s}.f32"))
                files[key] = f"{key}{s}.f32"
        out["steps"].append(files)
    with open(os.path.join(out_dir, "out.json"), "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
