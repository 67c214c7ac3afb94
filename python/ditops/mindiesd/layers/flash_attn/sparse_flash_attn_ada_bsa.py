"""MindIE-SD's ada_bsa entry points, refused: their block choice is the NPU kernel
sparse_block_estimate's (strided sampling, a cumulative-mass threshold, sink and recent blocks,
in half precision), which MindIE-SD does not define in a form ditops can reproduce."""

from ..._unsupported import refusing

_FEATURE = "ada_bsa sparse attention (the NPU's sparse_block_estimate block choice)"

get_estimate_mask = refusing("get_estimate_mask", _FEATURE)
ada_block_sparse_attention = refusing("ada_block_sparse_attention", _FEATURE)

__all__ = ["get_estimate_mask", "ada_block_sparse_attention"]
