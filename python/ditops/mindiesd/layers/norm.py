"""MindIE-SD's RMSNorm module and fast_layernorm."""

import torch

from ... import ops
from ..utils.exception import ParametersInvalid, raises_parameters_invalid
from .adalayernorm import fast_layernorm


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


__all__ = ["RMSNorm", "fast_layernorm"]
