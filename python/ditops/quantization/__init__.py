from .quantize import quantize
from .utils import TimestepManager
from .config import OnlineQuantConfig, QuantConfig, TimestepPolicyConfig

__all__ = ["quantize", "TimestepManager", "OnlineQuantConfig", "QuantConfig",
           "TimestepPolicyConfig"]
