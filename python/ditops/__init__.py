"""ditops: fused DiT/LLM operator kernels for the CPU (attention, RoPE, RMSNorm, RainFusion,
MLA decode, W8A8 linear layers) on torch CPU tensors and numpy arrays, under MindIE-SD's names.
See docs/python.md."""

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
    merge_attention_states,
    mla_decode_paged,
    rainfusion_attention,
    rms_norm,
    rotary_position_embedding,
    select_attention,
    sparse_attention,
)
from . import _arrays

if _arrays.torch is not None:
    from .nn import RMSNorm
    from .quant import QuantLinear, TimestepPolicyConfig, quantize, set_timestep
    from ._op import register_torch_ops

    _torch_library = register_torch_ops()

__version__ = "0.1.0"
