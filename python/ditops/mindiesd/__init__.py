"""mindiesd 3.1.0's public Python surface on ditops' CPU kernels: the same names, submodule
paths, signatures, defaults, semantics and error types, so that code written for MindIE-SD runs
unchanged on any CPU. `install()` (or `python -m ditops.mindiesd script.py`) makes
`import mindiesd` resolve here. What each name maps to, and what is refused: docs/mindiesd.md."""

import importlib
import importlib.util
import pkgutil
import sys

from .cache_agent import CacheConfig, CacheAgent
from .layers import (
    layernorm_scale_shift,
    attention_forward,
    attention_forward_varlen,
    rotary_position_embedding,
    get_activation_layer,
    RMSNorm,
    sparse_attention,
    fast_layernorm,
    frequency_regulator,
    fused_moe,
)
from .quantization import (
    quantize,
    OnlineQuantConfig,
    QuantConfig,
    TimestepManager,
    TimestepPolicyConfig,
)

__all__ = [
    "CacheConfig",
    "CacheAgent",
    "layernorm_scale_shift",
    "attention_forward",
    "attention_forward_varlen",
    "rotary_position_embedding",
    "get_activation_layer",
    "RMSNorm",
    "quantize",
    "OnlineQuantConfig",
    "QuantConfig",
    "TimestepManager",
    "TimestepPolicyConfig",
    "sparse_attention",
    "fast_layernorm",
    "frequency_regulator",
    "fused_moe",
]

# The version of MindIE-SD whose surface this module reproduces.
__version__ = "3.1.0"


def _real_mindiesd():
    """Where an installed mindiesd package lives, or None (ours, once installed, does not count)."""
    loaded = sys.modules.get("mindiesd")
    if loaded is not None:
        return None if loaded.__name__ == __name__ else getattr(loaded, "__file__", "loaded")
    try:
        spec = importlib.util.find_spec("mindiesd")
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin or "installed")


def install(force=False):
    """Makes `import mindiesd` and every submodule path of it (`mindiesd.layers`,
    `mindiesd.layers.flash_attn.attention_forward`, `mindiesd.quantization`, ...) resolve to
    this module in this process. A real mindiesd installation is never shadowed unless
    force=True: then ImportError names it. Returns this module. Idempotent."""
    real = _real_mindiesd()
    if real is not None and not force:
        raise ImportError(f"ditops.mindiesd.install: a real mindiesd is installed ({real}); "
                          "pass force=True to run on ditops instead")
    package = sys.modules[__name__]
    names = [__name__] + [info.name for info in pkgutil.walk_packages(__path__, __name__ + ".")
                          if not info.name.endswith("__main__")]
    for name in names:
        module = importlib.import_module(name)
        sys.modules["mindiesd" + name[len(__name__):]] = module
    return package


def installed():
    """Whether `import mindiesd` resolves to this module now."""
    return sys.modules.get("mindiesd") is sys.modules[__name__]
