"""MindIE-SD's muls_add: x · scale + y."""

import torch


def muls_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """x · scale + y, element-wise (torch; one pass under torch.compile)."""
    return x * scale + y


__all__ = ["muls_add"]
