"""mindiesd.quantization: MindIE-SD's quantize() and its configurations (ditops.quantization)."""

from ...quantization import (
    OnlineQuantConfig,
    QuantConfig,
    TimestepManager,
    TimestepPolicyConfig,
    quantize,
)

__all__ = ["quantize", "TimestepManager", "OnlineQuantConfig", "QuantConfig",
           "TimestepPolicyConfig"]
