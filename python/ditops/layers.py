"""MindIE-SD's layers over torch modules, on ditops' kernels: RMSNorm (a module), AdaLN
(layernorm_scale_shift: LayerNorm, then · (1 + scale) + shift) and fast_layernorm on
ops.layer_norm (each row's mean and variance in fp32, weight, bias, scale and shift applied in
fp32, one rounding to x's dtype), and get_activation_layer (torch's activation modules by name)."""

import math

import torch

from . import _arrays, ops
from .errors import ParametersInvalid, raises_parameters_invalid


def _as_kernel_operand(tensor, x):
    """A weight, bias, scale or shift as the kernel takes it: float32 or x's dtype (another
    dtype is converted to float32), the last dimension contiguous, outside autograd."""
    if tensor is None:
        return None
    tensor = tensor.detach()
    if tensor.dtype not in (torch.float32, x.dtype):
        tensor = tensor.to(torch.float32)
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _run(call_name, x, weight, bias, scale, shift, eps):
    """The fused kernel on x [..., D]; scale and shift None, or of x's rank with leading extents
    x's or 1."""
    if x.dtype not in _KERNEL_DTYPES:
        raise ParametersInvalid(f"{call_name}: x.dtype is {x.dtype}, expected torch.float32, "
                                "torch.bfloat16 or torch.float16 (fused=False runs torch's ops)")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight, bias, scale, shift = (_as_kernel_operand(t, x) for t in (weight, bias, scale, shift))
    if scale is not None and scale.dtype != shift.dtype:  # the kernel takes them in one dtype
        scale, shift = scale.to(torch.float32), shift.to(torch.float32)
    return ops.layer_norm(x, weight, bias, float(eps), scale, shift)


def _check_layernorm_scale_shift(layernorm, x, scale, shift, fused):
    """MindIE-SD's argument checks, in its order."""
    if not isinstance(layernorm, torch.nn.LayerNorm):
        raise ParametersInvalid("layernorm_scale_shift: layernorm must be a torch.nn.LayerNorm, "
                                f"got {type(layernorm).__name__}")
    for name, value in (("x", x), ("scale", scale), ("shift", shift)):
        if not isinstance(value, torch.Tensor):
            raise ParametersInvalid(f"layernorm_scale_shift: {name} must be a torch.Tensor, got "
                                    f"{type(value).__name__}")
    if not isinstance(fused, bool):
        raise ParametersInvalid(f"layernorm_scale_shift: fused must be a bool, got "
                                f"{type(fused).__name__}")
    if x.dim() != 3:
        raise ParametersInvalid(f"layernorm_scale_shift: x has {x.dim()} dimensions, expected 3 "
                                "([B, S, H])")
    for name, value in (("scale", scale), ("shift", shift)):
        if value.dim() not in (2, 3):
            raise ParametersInvalid(f"layernorm_scale_shift: {name} has {value.dim()} dimensions, "
                                    "expected 2 ([B, H]) or 3 ([B, 1, H] or [B, S, H])")
    for name, value in (("scale", scale), ("shift", shift)):
        if value.size(0) != x.size(0):
            raise ParametersInvalid(f"layernorm_scale_shift: {name}.size(0) ({value.size(0)}) "
                                    f"must equal x.size(0) ({x.size(0)})")
    for name, value in (("scale", scale), ("shift", shift)):
        if value.dim() == 3 and value.size(1) not in (1, x.size(1)):
            raise ParametersInvalid(f"layernorm_scale_shift: {name}.size(1) ({value.size(1)}) "
                                    f"must be 1 or x.size(1) ({x.size(1)})")
    if scale.size(-1) != x.size(-1):
        raise ParametersInvalid(f"layernorm_scale_shift: scale.size(-1) ({scale.size(-1)}) must "
                                f"equal x.size(-1) ({x.size(-1)})")
    if shift.size(-1) != scale.size(-1):
        raise ParametersInvalid(f"layernorm_scale_shift: shift.size(-1) ({shift.size(-1)}) must "
                                f"equal scale.size(-1) ({scale.size(-1)})")


@raises_parameters_invalid
def layernorm_scale_shift(layernorm, x, scale, shift, fused=True):
    """MindIE-SD's AdaLN: layernorm(x) · (1 + scale) + shift for x [B, S, H] and scale, shift
    [B, H] or [B, 1, H] (one row per batch element) or [B, S, H] (per token). fused=True: one
    pass of ditops' kernel, computed in fp32 and returned in x's dtype (float32, bfloat16 or
    float16); layernorm.normalized_shape must be (H,). fused=False: torch's ops, as MindIE-SD
    writes them (their dtype promotion and intermediate roundings)."""
    _check_layernorm_scale_shift(layernorm, x, scale, shift, fused)
    if not fused or x.numel() == 0:
        scale = scale[:, None] if scale.dim() == 2 else scale
        shift = shift[:, None] if shift.dim() == 2 else shift
        return layernorm(x) * (1 + scale) + shift
    if tuple(layernorm.normalized_shape) != (x.size(-1),):
        raise ParametersInvalid(f"layernorm_scale_shift: layernorm.normalized_shape "
                                f"{list(layernorm.normalized_shape)} must be [x.size(-1)] "
                                f"([{x.size(-1)}])")
    _arrays.check_inputs("layernorm_scale_shift", x=x, scale=scale, shift=shift)
    scale = scale[:, None] if scale.dim() == 2 else scale
    shift = shift[:, None] if shift.dim() == 2 else shift
    return _run("layernorm_scale_shift", x, layernorm.weight, layernorm.bias, scale, shift,
                layernorm.eps)


@raises_parameters_invalid
def fast_layernorm(norm, x, impl_mode=0, fused=True):
    """MindIE-SD's fast_layernorm: norm(x) for a torch.nn.LayerNorm `norm`, over its
    normalized_shape (x's last dimensions). fused=True runs ditops' kernel (fp32 statistics, x's
    dtype out, float32, bfloat16 or float16); impl_mode (0 high precision, 1 high performance,
    2 float16, which requires x, weight and bias all float16) is checked as MindIE-SD checks it,
    and every mode computes alike in fp32. fused=False: norm(x)."""
    if not isinstance(norm, torch.nn.LayerNorm):
        raise ParametersInvalid(f"fast_layernorm: norm must be a torch.nn.LayerNorm, got "
                                f"{type(norm).__name__}")
    if not isinstance(fused, bool):
        raise ParametersInvalid(f"fast_layernorm: fused must be a bool, got "
                                f"{type(fused).__name__}")
    if impl_mode not in (0, 1, 2):
        raise ParametersInvalid(f"fast_layernorm: impl_mode ({impl_mode}) must be 0, 1 or 2")
    if not isinstance(x, torch.Tensor):
        raise ParametersInvalid(f"fast_layernorm: x must be a torch.Tensor, got "
                                f"{type(x).__name__}")
    shape = tuple(norm.normalized_shape)
    if len(shape) > x.dim():
        raise ParametersInvalid(f"fast_layernorm: norm.normalized_shape {list(shape)} has more "
                                f"dimensions than x ({x.dim()})")
    if impl_mode == 2 and not all(t is None or t.dtype == torch.float16
                                  for t in (x, norm.weight, norm.bias)):
        raise ParametersInvalid("fast_layernorm: impl_mode 2 requires x, norm.weight and "
                                "norm.bias (where present) all float16")
    if not fused or x.numel() == 0:
        return norm(x)
    leading = tuple(x.shape[:x.dim() - len(shape)])
    if tuple(x.shape[len(leading):]) != shape:
        raise ParametersInvalid(f"fast_layernorm: x's last dimensions "
                                f"{list(x.shape[len(leading):])} must equal "
                                f"norm.normalized_shape {list(shape)}")
    _arrays.check_inputs("fast_layernorm", x=x)
    # LayerNorm over the last k dimensions is LayerNorm over them flattened into one.
    width = math.prod(shape)
    flat = [None if t is None else t.reshape(width) for t in (norm.weight, norm.bias)]
    out = _run("fast_layernorm", x.reshape(*leading, width), *flat, None, None, norm.eps)
    return out.reshape(x.shape)


class RMSNorm(torch.nn.Module):
    """MindIE-SD's RMSNorm(hidden_size, eps=1e-6): x / sqrt(mean(x²) + eps) · weight over the
    last dimension, computed in fp32, returned in x's dtype; weight a Parameter of ones (load a
    checkpoint's into .weight; `dtype`, a ditops addition, makes it of that dtype); eps is
    `variance_epsilon`, as MindIE-SD names it (`eps` reads it too).
    forward(hidden_states, if_fused=True): if_fused=False runs MindIE-SD's unfused formula
    (normalized in fp32, cast to x's dtype, then times the weight) in torch."""

    def __init__(self, hidden_size, eps=1e-6, *, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    @property
    def eps(self):
        return self.variance_epsilon

    @raises_parameters_invalid
    def forward(self, hidden_states, if_fused=True):
        if not 2 <= hidden_states.dim() <= 8:
            raise ParametersInvalid(f"RMSNorm: hidden_states has {hidden_states.dim()} "
                                    "dimensions, expected 2 to 8")
        if not if_fused:
            rows = hidden_states.to(torch.float32)
            rows = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * rows.to(hidden_states.dtype)
        weight = self.weight
        if weight.dtype not in (torch.float32, hidden_states.dtype):
            weight = weight.to(torch.float32)
        return ops.rms_norm(hidden_states, weight.detach(), self.variance_epsilon)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"


class GELU(torch.nn.Module):
    """GELU with approximate "none" (erf), "tanh", or "fast" (MindIE-SD's NPU fast GELU,
    x · sigmoid(1.702 x))."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh", "fast"):
            raise ParametersInvalid(f"GELU: approximate \"{approximate}\" is not none, tanh or "
                                    "fast")
        self.approximate = approximate

    def forward(self, hidden_states):
        if self.approximate == "fast":
            return hidden_states * torch.sigmoid(1.702 * hidden_states)
        return torch.nn.functional.gelu(hidden_states, approximate=self.approximate)


_ACTIVATIONS = {
    "swish": torch.nn.SiLU,
    "silu": torch.nn.SiLU,
    "mish": torch.nn.Mish,
    "gelu": GELU,
    "relu": torch.nn.ReLU,
    "gelu-tanh": lambda: GELU("tanh"),
    "gelu-fast": lambda: GELU("fast"),
}


def get_activation_layer(act_type: str) -> torch.nn.Module:
    """The activation module of `act_type` (case-insensitive): swish, silu, mish, gelu, relu,
    gelu-tanh or gelu-fast."""
    if not isinstance(act_type, str) or act_type.lower() not in _ACTIVATIONS:
        raise ParametersInvalid(f"get_activation_layer: unsupported activation {act_type!r}; "
                                f"one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[act_type.lower()]()


__all__ = ["RMSNorm", "layernorm_scale_shift", "fast_layernorm", "get_activation_layer", "GELU"]
