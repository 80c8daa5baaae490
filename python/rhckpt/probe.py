"""rhckpt.probe: a few lines in a user's training loop that let resume-harness tell WHY a resumed
run differs, by recording hashes of everything a step depends on.

    from rhckpt import probe
    probe.after_load(iteration, model, optimizer=None, scheduler=None, state=None)   # right after restoring
    probe.after_step(iteration, model, optimizer=None, scheduler=None, loss=None, batch=None,
                     metrics=None, state=None)                                        # after each optimizer step

Without the environment variable RH_PROBE_DIR every call returns at once (this module imports
only the standard library; torch, numpy and xxhash are imported on the first recorded call).
With it, each call appends one JSON line to $RH_PROBE_DIR/probe.jsonl (a process whose RANK
environment variable is set and not 0 writes probe.rank<RANK>.jsonl instead, so data-parallel
ranks never interleave):

    {"event": "after_load"|"step", "iteration": N, "metrics": [[name, text], ...], "state": [[key, hash], ...]}

metrics (step only): `loss` first, then the `metrics` dict in insertion order; floats and
one-element tensors as float.hex of the Python float (exact: float32/bf16/fp16 widen exactly),
ints in decimal, bools true/false. state, cause before effect: data/batch (step only), rng/python,
rng/numpy (only if numpy is already imported), rng/torch, rng/cuda/<i>, scheduler/<key> (sorted,
nested dicts joined with '/'), optimizer/param_groups/<i>/<key> (sorted; 'params' is the tuple of
the group's parameter labels, in the group's order, so a layout with the parameters in another
order differs there), mode/. (the root module's .training) and mode/<name> for each submodule of
model.named_modules() whose .training differs from the root's (a model left in eval mode differs
at mode/.), param/<name>, buffer/<name>, optimizer/state/<label>/<key>. A parameter's label is
its name, mapped through identity with model.named_parameters(); a parameter the model does not
name is labelled by its index as in optimizer.state_dict(). state/<key> (the user's dict, keys
sorted by str) comes last.
hash: 16 lower-case hex digits of XXH3-64 over a canonical serialization: a tensor is
b"T" + dtype name ("float32") + b":" + shape ("2x3", "" for 0-dim) + b":" + its raw bytes
(contiguous, on the CPU); a numpy array the same with b"N"; other values the UTF-8 of an exact
text (floats float.hex, ints decimal, bools true/false, None none, str as is; tuples and lists
"(a,b)", dicts "{k:v,...}" in their order, recursively).
The probe only reads: no RNG draw, no in-place op, no .grad access; the training computation is
the same with and without it. A model with `.module` (DistributedDataParallel) is unwrapped.
"""
import json
import os
import random
import sys

ENV = "RH_PROBE_DIR"


def after_load(iteration, model, optimizer=None, scheduler=None, state=None):
    """Records the state just restored from a checkpoint (event "after_load")."""
    where = os.environ.get(ENV)
    if not where:
        return
    _write(where, {"event": "after_load", "iteration": int(iteration), "metrics": [],
                   "state": _state(model, optimizer, scheduler, None, state, with_batch=False)})


def after_step(iteration, model, optimizer=None, scheduler=None, loss=None, batch=None, metrics=None, state=None):
    """Records one finished step (event "step"): its metrics and the state after the step."""
    where = os.environ.get(ENV)
    if not where:
        return
    rows = []
    if loss is not None:
        rows.append(["loss", metric_text(loss)])
    for name, value in (metrics or {}).items():
        rows.append([str(name), metric_text(value)])
    _write(where, {"event": "step", "iteration": int(iteration), "metrics": rows,
                   "state": _state(model, optimizer, scheduler, batch, state, with_batch=batch is not None)})


# --- text and hashes ---------------------------------------------------------------------------

def metric_text(v):
    """Exact text of a metric: float.hex for floats and floating one-element tensors, decimal ints."""
    if hasattr(v, "item") and callable(v.item):   # torch tensor or numpy scalar/array
        v = v.detach().item() if hasattr(v, "detach") else v.item()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return "%d" % v
    if isinstance(v, float):
        return v.hex()
    return str(v)


def _tensor_bytes(t):
    import torch
    t = t.detach().to("cpu").contiguous()
    name = str(t.dtype).replace("torch.", "")
    if t.dtype in (torch.bfloat16, torch.float16):
        raw = t.view(torch.int16).numpy().tobytes()
    elif t.dtype == torch.bool:
        raw = t.view(torch.uint8).numpy().tobytes()
    elif t.is_complex():
        raw = torch.view_as_real(t.resolve_conj()).contiguous().numpy().tobytes()
    elif t.is_quantized:
        raw = t.int_repr().numpy().tobytes() + str(t.q_scale()).encode() + str(t.q_zero_point()).encode()
    else:
        raw = t.numpy().tobytes()
    return b"T" + name.encode() + b":" + "x".join(str(s) for s in t.shape).encode() + b":" + raw


def canonical(v):
    """The bytes a value is hashed over (see the module docstring)."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(v, torch.Tensor):
        return _tensor_bytes(v)
    if np is not None and isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        if a.dtype.hasobject:
            return b"N" + str(a.dtype).encode() + b":" + canonical(a.tolist())
        return (b"N" + str(a.dtype).encode() + b":" + "x".join(str(s) for s in a.shape).encode() + b":" + a.tobytes())
    if np is not None and isinstance(v, np.generic):
        v = v.item()
    if v is None:
        return b"none"
    if isinstance(v, bool):
        return b"true" if v else b"false"
    if isinstance(v, int):
        return b"%d" % v
    if isinstance(v, float):
        return v.hex().encode()
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, (list, tuple)):
        return b"(" + b",".join(canonical(x) for x in v) + b")"
    if isinstance(v, dict):
        return b"{" + b",".join(canonical(k) + b":" + canonical(x) for k, x in v.items()) + b"}"
    return repr(v).encode("utf-8", "surrogatepass")


def digest(v):
    import xxhash   # Debian python3-xxhash
    return xxhash.xxh3_64_hexdigest(canonical(v))


# --- the state, in order -------------------------------------------------------------------------

def _flatten(prefix, v, out):
    if isinstance(v, dict) and v:
        for k in sorted(v, key=str):
            _flatten(prefix + "/" + str(k), v[k], out)
    else:
        out.append([prefix, digest(v)])


def _unwrap(model):
    while model is not None and hasattr(model, "module") and hasattr(model.module, "named_parameters"):
        model = model.module
    return model


def _state(model, optimizer, scheduler, batch, user_state, with_batch):
    out = []
    if with_batch:
        out.append(["data/batch", digest(batch)])
    _rng_rows(out)
    model = _unwrap(model)
    labels = _labels(model, optimizer)
    _scheduler_rows(scheduler, out)
    _param_group_rows(optimizer, labels, out)
    _model_rows(model, out)
    _optimizer_state_rows(optimizer, labels, out)
    if user_state:
        for k in sorted(user_state, key=str):
            _flatten("state/" + str(k), user_state[k], out)
    return out


# Each section appends its rows to `out`; _state calls them in the documented order, and
# rhckpt.autoprobe calls single sections (the scheduler's step changes only two of them).

def _rng_rows(out):
    import torch   # the caller trains with torch; imported only when recording
    out.append(["rng/python", digest(random.getstate())])
    if "numpy" in sys.modules:
        out.append(["rng/numpy", digest(sys.modules["numpy"].random.get_state())])
    out.append(["rng/torch", digest(torch.get_rng_state())])
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out.append(["rng/cuda/%d" % i, digest(torch.cuda.get_rng_state(i))])


def _labels(model, optimizer):
    """Per param group: [(parameter, label)], the label also keying optimizer/state (model unwrapped)."""
    names = {}
    if model is not None:
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
    labels = []
    if optimizer is not None:
        index = 0
        for group in optimizer.param_groups:
            labels.append([])
            for p in group["params"]:
                labels[-1].append((p, names.get(id(p), str(index))))
                index += 1
    return labels


def _scheduler_rows(scheduler, out):
    if scheduler is not None:
        sd = scheduler.state_dict()
        for k in sorted(sd, key=str):
            _flatten("scheduler/" + str(k), sd[k], out)


def _param_group_rows(optimizer, labels, out):
    if optimizer is not None:
        for i, group in enumerate(optimizer.param_groups):
            for k in sorted(group, key=str):
                if k == "params":
                    out.append(["optimizer/param_groups/%d/params" % i, digest(tuple(label for _, label in labels[i]))])
                else:
                    _flatten("optimizer/param_groups/%d/%s" % (i, k), group[k], out)


def _model_rows(model, out):
    if model is not None:
        root = bool(model.training)
        out.append(["mode/.", digest(root)])
        for name, m in model.named_modules():
            if name and bool(m.training) != root:
                out.append(["mode/" + name, digest(bool(m.training))])
        for name, p in model.named_parameters():
            out.append(["param/" + name, digest(p)])
        for name, b in model.named_buffers():
            out.append(["buffer/" + name, digest(b)])


def _optimizer_state_rows(optimizer, labels, out):
    for group in labels:
        for p, label in group:
            st = optimizer.state.get(p)
            if not st:
                continue
            for k in sorted(st, key=str):
                _flatten("optimizer/state/%s/%s" % (label, k), st[k], out)


def _write(where, record):
    os.makedirs(where, exist_ok=True)
    rank = os.environ.get("RANK", "")
    name = "probe.jsonl" if rank in ("", "0") else "probe.rank%s.jsonl" % rank
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with open(os.path.join(where, name), "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
