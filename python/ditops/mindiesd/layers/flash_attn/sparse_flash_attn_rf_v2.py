"""mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2: MindIE-SD's rf_v2 block choice
(ditops.rainfusion_v2) and its kernel entry rain_fusion_attention (ditops.sparse)."""

from ....rainfusion_v2 import (
    BLOCK_SIZES,
    Plan,
    choose_blocks,
    layout_plan,
    rf_attention,
    spans_plan,
)
from ....sparse import rain_fusion_attention

__all__ = ["BLOCK_SIZES", "Plan", "choose_blocks", "layout_plan", "rain_fusion_attention",
           "rf_attention", "spans_plan"]
