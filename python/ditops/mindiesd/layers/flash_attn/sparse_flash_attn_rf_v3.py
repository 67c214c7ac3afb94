"""mindiesd.layers.flash_attn.sparse_flash_attn_rf_v3: MindIE-SD's rf_v3 (ditops.sparse)."""

from ....sparse import PRECISIONS, bsa_sparse_attention_v3

__all__ = ["bsa_sparse_attention_v3", "PRECISIONS"]
