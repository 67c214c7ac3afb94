from .attention_forward import attention_forward
from .attention_forward_varlen import attention_forward_varlen
from .sparse_flash_attn import sparse_attention
from ..._unsupported import refusing

SparseLinearAttention = refusing("SparseLinearAttention", "sparse linear attention (a Triton-Ascend "
                                 "kernel)")

__all__ = ["attention_forward", "attention_forward_varlen", "sparse_attention",
           "SparseLinearAttention"]
