from .flash_attn.attention_forward import attention_forward
from .flash_attn.attention_forward_varlen import attention_forward_varlen
from .flash_attn.sparse_flash_attn import sparse_attention
from ._custom_ops import frequency_regulator
from .activation import get_activation_layer
from .norm import RMSNorm, fast_layernorm
from .adalayernorm import layernorm_scale_shift
from .muls_add import muls_add
from .residual_gate_add import residual_gate_add
from .rope import rotary_position_embedding
from .fused_moe import fused_moe
from .flash_attn import SparseLinearAttention

__all__ = [
    "RMSNorm",
    "attention_forward",
    "attention_forward_varlen",
    "fast_layernorm",
    "frequency_regulator",
    "fused_moe",
    "get_activation_layer",
    "layernorm_scale_shift",
    "muls_add",
    "residual_gate_add",
    "rotary_position_embedding",
    "sparse_attention",
    "SparseLinearAttention",
]
