"""numpy arrays as rhckpt.stored() gives them -> torch tensors in the safetensors dtype they
were stored in (Checkpoint.to_torch / state_dict). Bits are reinterpreted, never converted: a
BF16 element is the same 16 bits in the torch tensor. Not for torch.save files (torch_bridge)."""
import numpy as np


def _torch():
    try:
        import torch
    except ImportError as e:   # the one dependency rhckpt does not need otherwise
        raise ImportError("rhckpt to_torch()/state_dict() need torch (pip install torch, or Debian's "
                          "python3-torch); stored() gives the same elements as numpy") from e
    return torch


def as_torch(dtype, stored, key=""):
    """A torch tensor holding `stored` (numpy, as safetensors.STORAGE reads dtype) in `dtype`."""
    torch = _torch()
    a = np.array(stored, order="C")   # a copy the tensor owns; a scale stays 0-d
    if dtype == "BF16":   # uint16 bits -> int16 (torch 1.x has no uint16) -> view as bfloat16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if dtype == "F8_E4M3":
        t = torch.from_numpy(a.view(np.uint8))
        f8 = getattr(torch, "float8_e4m3fn", None)
        return t.view(f8) if f8 is not None else t
    if dtype in ("F64", "F32", "F16", "I64", "I32", "I16", "U8"):
        return torch.from_numpy(a)
    raise ValueError("tensor '%s': no torch dtype for %s" % (key, dtype))
