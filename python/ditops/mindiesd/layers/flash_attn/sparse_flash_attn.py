"""mindiesd.layers.flash_attn.sparse_flash_attn: MindIE-SD's sparse_attention (ditops.sparse)."""

from ....sparse import SPARSE_TYPES, sparse_attention

__all__ = ["sparse_attention", "SPARSE_TYPES"]
