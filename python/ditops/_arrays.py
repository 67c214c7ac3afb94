"""What every call shares: telling torch tensors from numpy arrays, making outputs of the
caller's kind, refusing arguments of the wrong type and calls that would need a gradient."""

import numpy as np

try:
    import torch
except ImportError:  # numpy-only use
    torch = None


def is_torch(value):
    return torch is not None and isinstance(value, torch.Tensor)


def native(function):
    """`function` of the C++ module, taking torch tensors as DLPack capsules made by torch's C
    exporter (a tenth of the cost of Tensor.__dlpack__, which nanobind would call); numpy
    arrays and other arguments pass as they are."""
    if torch is None:
        return function
    to_dlpack = torch._C._to_dlpack
    # By exact type, the cheapest test per argument; other Tensor subclasses still work, through
    # nanobind's own (slower) Tensor.__dlpack__ call.
    tensor_types = frozenset({torch.Tensor, torch.nn.Parameter})

    def call(*args):
        return function(*[to_dlpack(a) if type(a) in tensor_types else a for a in args])

    call.__name__ = function.__name__
    call.__doc__ = function.__doc__
    return call


def torch_compiling(value):
    """Whether torch.compile is tracing a call on `value` (a torch tensor)."""
    return is_torch(value) and torch.compiler.is_compiling()


def empty(like, shape, dtype=None):
    """An uninitialized output of `like`'s kind (torch tensor or numpy array) and device.
    `shape` None: like's (and its memory order); `dtype` None: like's, else a numpy dtype name
    ("float32", "int32", "bool")."""
    if is_torch(like):
        if shape is None and dtype is None:
            return torch.empty_like(like)  # the cheapest torch allocation
        return like.new_empty(like.shape if shape is None else shape,
                              dtype=like.dtype if dtype is None else getattr(torch, dtype))
    return np.empty(like.shape if shape is None else shape,
                    dtype=like.dtype if dtype is None else dtype)


def int32_vector(values, like, call, name):
    """cu_seqlens / seq_lens: a contiguous int32 vector of `like`'s kind, from a list, a tuple, a
    numpy array or a tensor (copied only when not already that); another type is a TypeError
    naming the call and the argument."""
    if not (isinstance(values, (list, tuple, np.ndarray)) or is_torch(values)):
        raise TypeError(f"ditops.{call}: {name} must be a list, a numpy.ndarray or a "
                        f"torch.Tensor of int32 offsets, got {type(values).__name__}")
    if is_torch(like):
        values = torch.as_tensor(values, dtype=torch.int32, device="cpu")
        return values.contiguous()
    return np.ascontiguousarray(np.asarray(values, dtype=np.int32))


def float32_mask(mask):
    """An additive mask of another float dtype as float32 (the kernels take f32 or bool)."""
    if mask is None:
        return None
    if is_torch(mask):
        if mask.dtype in (torch.bool, torch.float32):
            return mask
        return mask.to(torch.float32)
    if mask.dtype in (np.bool_, np.float32):
        return mask
    return mask.astype(np.float32)


def float32_table(table, x):
    """A cos / sin table as the kernels take it: float32 or x's dtype; another float dtype is
    widened to float32 (exact from bfloat16 and float16)."""
    if table.dtype == x.dtype:
        return table
    if is_torch(table):
        return table if table.dtype == torch.float32 else table.to(torch.float32)
    return table if table.dtype == np.float32 else table.astype(np.float32)


def check_inputs(call, optional=(), torch_only=False, **tensors):
    """The one check at the boundary of every public call, before anything reads its inputs:
    each of `tensors` (keyword: the argument's name) is a torch tensor or a numpy array (a torch
    tensor only with torch_only: calls written in torch), or None where `optional` names it,
    else a TypeError naming the call and the argument; and, ditops computing forward passes
    only, none requires grad while autograd records (a RuntimeError instead of outputs without
    a gradient)."""
    for name, value in tensors.items():
        if not (is_torch(value) or (isinstance(value, np.ndarray) and not torch_only)
                or (value is None and name in optional)):
            kinds = "a torch.Tensor" + ("" if torch_only else " or a numpy.ndarray") + (
                " or None" if name in optional else "")
            raise TypeError(f"ditops.{call}: {name} must be {kinds}, got {type(value).__name__}")
    if torch is None or not torch.is_grad_enabled():
        return
    for tensor in tensors.values():
        if is_torch(tensor) and tensor.requires_grad:
            raise RuntimeError(
                f"ditops.{call} is forward-only (no gradient); an input requires grad: call it "
                "under torch.no_grad() or torch.inference_mode(), or detach the inputs"
            )
