"""MindIE-SD's residual_gate_add: x + y · gate, accumulated in fp32."""

import torch


def residual_gate_add(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x + y · gate computed in float32 and returned in x's dtype (a DiT block's gated residual)."""
    return (x + y.float() * gate.float()).to(x.dtype)


__all__ = ["residual_gate_add"]
