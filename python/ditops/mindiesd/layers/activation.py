"""MindIE-SD's get_activation_layer: torch's activation modules by name."""

import torch

from ..utils.exception import ParametersInvalid


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


__all__ = ["get_activation_layer", "GELU"]
