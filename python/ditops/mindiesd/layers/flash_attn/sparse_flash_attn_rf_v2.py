"""mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2: MindIE-SD's rf_v2 block choice, the
3.1.0 helpers that build its index form (ditops.rainfusion_v2) and the kernel entry that takes
it, rain_fusion_attention (ditops.sparse)."""

from ....rainfusion_v2 import (
    BLOCK_SIZES,
    Plan,
    avgpool,
    choose_blocks,
    do_tensor_inv_rearrange,
    do_tensor_rearrange_pooling,
    get_blockwise_mask,
    get_mask_index,
    inv_rearrange_with_remaining,
    layout_plan,
    rearrange_with_remaining,
    rf_attention,
    spans_plan,
)
from ....sparse import rain_fusion_attention

__all__ = ["BLOCK_SIZES", "Plan", "avgpool", "choose_blocks", "do_tensor_inv_rearrange",
           "do_tensor_rearrange_pooling", "get_blockwise_mask", "get_mask_index",
           "inv_rearrange_with_remaining", "layout_plan", "rain_fusion_attention",
           "rearrange_with_remaining", "rf_attention", "spans_plan"]
