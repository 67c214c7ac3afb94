"""mindiesd.quantization.config: MindIE-SD's quantization configurations
(ditops.quantization.config)."""

from ...quantization.config import OnlineQuantConfig, QuantConfig, TimestepPolicyConfig

__all__ = ["OnlineQuantConfig", "QuantConfig", "TimestepPolicyConfig"]
