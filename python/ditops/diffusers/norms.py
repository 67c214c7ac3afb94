"""A model's q/k RMSNorms and diffusers' rotary embedding on ditops: the RMSNorm modules
become ditops RMSNorms over the same weights; diffusers' `apply_rotary_emb` (FLUX, HunyuanVideo,
CogVideoX) is replaced, while any model is enabled, by the same math on ditops' kernel (diffusers'
own for the forms the kernel does not take); and where a q/k RMSNorm comes right before the
rotary embedding, both run as one fused pass (norm_then_rope, rms_norm_rope)."""

import torch

from .. import ops
from . import _internals

QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")


class RMSNorm(torch.nn.Module):
    """A model's torch.nn.RMSNorm or diffusers RMSNorm, on ditops: the same weight (shared,
    not copied) and eps."""

    def __init__(self, original):
        super().__init__()
        self.original = [original]  # not a submodule: state_dict keeps the model's own names
        self.weight = original.weight
        self.eps = original.eps  # None: torch.nn.RMSNorm's default, the input dtype's epsilon

    def forward(self, x):
        weight, eps = rms_norm_weight_eps(self, x)
        return ops.rms_norm(x, weight, eps)


def is_rms_norm(module):
    """Whether `module` is an RMSNorm (torch's or diffusers') with a weight."""
    return isinstance(module, _internals.rms_norm_classes()) and getattr(
        module, "weight", None) is not None


def swap_qk_norms(model):
    """Every q/k RMSNorm of `model` replaced by ditops' over its weight: [(module, attribute,
    original)] to put back."""
    swapped = []
    for module in model.modules():
        for attribute in QK_NORMS:
            norm = getattr(module, attribute, None)
            if norm is not None and is_rms_norm(norm):
                setattr(module, attribute, RMSNorm(norm))
                swapped.append((module, attribute, norm))
    return swapped


def rms_norm_weight_eps(norm, x):
    """(weight, eps) of a q/k norm that is an RMSNorm with a weight (a model's own, or ditops'
    RMSNorm over it) as ops take them for x, else None."""
    if not isinstance(norm, RMSNorm) and not is_rms_norm(norm):
        return None
    weight = norm.weight
    if weight.dtype not in (x.dtype, torch.float32):
        weight = weight.to(x.dtype)
    eps = torch.finfo(x.dtype).eps if norm.eps is None else float(norm.eps)
    return weight, eps


def norm_then_rope(norm, x, heads, cos, sin):
    """norm(x) unflattened to [B, S, heads, D], then the interleaved rotary embedding: one
    fused ditops pass when norm is an RMSNorm with a weight (over each head or, as in Wan, over
    the whole inner dimension), else the norm module then ditops' rotary embedding."""
    params = rms_norm_weight_eps(norm, x)
    if (params is None or params[0].ndim != 1
            or params[0].shape[0] not in (x.shape[-1], x.shape[-1] // heads)):
        x = norm(x).unflatten(2, (heads, -1))
        return ops.rotary_position_embedding(x, cos, sin, "rotated_interleaved")
    weight, eps = params
    return ops.rms_norm_rotary_position_embedding(x.unflatten(2, (heads, -1)), weight, cos, sin,
                                                  eps, "rotated_interleaved")


# ---- diffusers' apply_rotary_emb ----------------------------------------------------------------

_rope_users = 0
_original_rope = {}


def _ditops_apply_rotary_emb(x, freqs_cis, use_real=True, use_real_unbind_dim=-1,
                             sequence_dim=2):
    """diffusers' apply_rotary_emb on ditops for its common form (real cos/sin [S, D],
    interleaved pairs, sequence dim 1 or 2): the same fp32 math, rounded once."""
    original = _original_rope["function"]
    if (not use_real or use_real_unbind_dim != -1 or sequence_dim not in (1, 2)
            or not isinstance(freqs_cis, (tuple, list)) or x.ndim != 4
            or x.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        return original(x, freqs_cis, use_real, use_real_unbind_dim, sequence_dim)
    cos, sin = freqs_cis
    if cos.ndim != 2 or cos.dtype not in (torch.float32, x.dtype):
        return original(x, freqs_cis, use_real, use_real_unbind_dim, sequence_dim)
    return ops.rotary_position_embedding(x, cos, sin, rotated_mode="rotated_interleaved",
                                         head_first=sequence_dim == 2)


def patch_rope(enable):
    """Counts the enabled models: the first replaces diffusers' apply_rotary_emb, the last one
    disabled puts it back."""
    global _rope_users
    _rope_users += 1 if enable else -1
    modules = _internals.rope_modules()
    if enable and _rope_users == 1:
        _original_rope["function"] = modules[0].apply_rotary_emb
        for module in modules:
            module.apply_rotary_emb = _ditops_apply_rotary_emb
    elif not enable and _rope_users == 0:
        for module in modules:
            module.apply_rotary_emb = _original_rope["function"]
