"""MindIE-SD's rf_v3: rf_v2's block choice made per batch entry, on ditops' block-sparse
kernel; its quantized kernels (precision "mix" and "fp8") are refused."""

import torch

from ..._unsupported import refusing
from ...utils.exception import ParametersInvalid, raises_parameters_invalid
from . import sparse_flash_attn_rf_v2 as rf_v2

PRECISIONS = ("bf16", "mix", "fp8")


@raises_parameters_invalid
def bsa_sparse_attention_v3(q, k, v, latent_shape_q, latent_shape_k=None, txt_len=0,
                            sparsity=0.5, input_layout="BSND", head_num=None,
                            num_key_value_heads=None, scale=None, inner_precise=4,
                            cached_mask=None, protect_first_frame=True, q_rot=None, k_rot=None,
                            block_size=128, block_size_kv=None, video_spans=None,
                            precision="bf16"):
    """MindIE-SD's rf_v3 sparse attention: (out, block mask int8 [B, N, blocks, blocks]). The
    tokens as rf_v2 orders them (txt_len text tokens first in the input, one video of
    latent_shape_q, or video_spans instead of both), each batch entry's own rf_v2 block choice
    (the first-frame blocks forced only with protect_first_frame; always with video_spans), or
    cached_mask (a mask this function returned, nonzero = keep) reused as it is. precision
    "bf16" only: "mix" and "fp8" (quantized NPU kernels) raise FeatureNotSupported.
    latent_shape_k, head_num, num_key_value_heads, inner_precise, q_rot, k_rot and
    block_size_kv change nothing here (MindIE-SD: the key layout is the query's, heads come
    from the tensors, the rest serves the quantized kernels)."""
    if precision not in PRECISIONS:
        raise ParametersInvalid(f"precision must be one of {PRECISIONS}, got {precision!r}.")
    if precision != "bf16":
        refusing("bsa_sparse_attention_v3", f"precision {precision!r} (a quantized NPU kernel)")()
    head_first, plan, block_size = rf_v2.checked_plan(q, k, v, input_layout, latent_shape_q,
                                                      txt_len, video_spans, block_size,
                                                      protect_first_frame)
    sparsity = rf_v2.checked_sparsity(sparsity)
    mask = None
    if cached_mask is not None:
        blocks = plan.forced.numel()
        if not isinstance(cached_mask, torch.Tensor) or cached_mask.dim() != 4 or tuple(
                cached_mask.shape[2:]) != (blocks, blocks):
            raise ParametersInvalid(f"cached_mask must be a [B, N, {blocks}, {blocks}] tensor "
                                    "(a mask bsa_sparse_attention_v3 returned for this layout).")
        mask = cached_mask != 0
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, mask = rf_v2.rf_attention(q, k, v, plan, sparsity, block_size, scale, head_first,
                                   shared_mask=False, mask=mask)
    return out, (mask.to(torch.int8) if cached_mask is None else cached_mask)
