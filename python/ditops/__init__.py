"""ditops: fused DiT/LLM operator kernels for the CPU (attention, RoPE, RMSNorm, LayerNorm,
RainFusion, MLA decode, W8A8 linear layers) on torch CPU tensors and numpy arrays, under
MindIE-SD's names. The package is in three layers that import only downward: this core;
ditops.mindiesd (MindIE-SD's module paths and error mapping over the core) and ditops.diffusers
(the integration into diffusers' models) on top of it, neither importing the other. See
docs/python.md and docs/mindiesd.md."""

from ._ditops import (
    Error,
    backend_names,
    cpu_info,
    forget_attention_tuning,
    num_threads,
    set_num_threads,
)
from .ops import (
    add_rms_norm,
    attention_forward,
    attention_forward_varlen,
    block_sparse_attention,
    cfg_combine,
    layer_norm,
    merge_attention_states,
    mla_decode_paged,
    rainfusion_attention,
    rms_norm,
    rms_norm_rotary_position_embedding,
    rotary_position_embedding,
    scaled_dot_product_attention,
    select_attention,
)
from . import _arrays

__all__ = ["Error", "backend_names", "cpu_info", "forget_attention_tuning", "num_threads",
           "set_num_threads", "add_rms_norm", "attention_forward", "attention_forward_varlen",
           "block_sparse_attention", "cfg_combine", "layer_norm", "merge_attention_states",
           "mla_decode_paged", "rainfusion_attention", "rms_norm",
           "rms_norm_rotary_position_embedding", "rotary_position_embedding",
           "scaled_dot_product_attention", "select_attention"]

if _arrays.torch is not None:
    from .calibration import Calibration, calibrate
    from .quant import QuantLinear, set_timestep
    from ._op import register_torch_ops

    # MindIE-SD's names that are not plain operators (ditops.mindiesd re-exports these objects).
    from .layers import (
        RMSNorm,
        fast_layernorm,
        get_activation_layer,
        layernorm_scale_shift,
    )
    from .quantization import (
        OnlineQuantConfig,
        QuantConfig,
        TimestepManager,
        TimestepPolicyConfig,
        quantize,
    )
    from .sparse import sparse_attention
    from .step_cache import CacheAgent, CacheConfig

    _torch_library = register_torch_ops()
    __all__ += ["Calibration", "calibrate", "QuantLinear", "set_timestep", "CacheAgent",
                "CacheConfig", "OnlineQuantConfig", "QuantConfig", "RMSNorm", "TimestepManager",
                "TimestepPolicyConfig", "fast_layernorm", "get_activation_layer",
                "layernorm_scale_shift", "quantize", "sparse_attention"]

__version__ = "0.1.0"
