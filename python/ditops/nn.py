"""torch.nn modules over ditops' kernels (forward only: their parameters do not require grad)."""

import torch

from . import ops


class RMSNorm(torch.nn.Module):
    """MindIE-SD's RMSNorm(hidden_size, eps): x / sqrt(mean(x²) + eps) · weight over the last
    dimension, weight initialized to ones (load a checkpoint's into .weight)."""

    def __init__(self, hidden_size, eps=1e-6, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"
