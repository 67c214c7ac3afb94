"""MindIE-SD's sparse attention: sparse_attention (dense, rf_v2, rf_v3) and rf_v3's
bsa_sparse_attention_v3, both on the rf_v2 block choice (ditops.rainfusion_v2) and ditops'
block-sparse kernel; the NPU's quantized rf_v3 kernels ("mix", "fp8") and ada_bsa are refused."""

import torch

from . import _arrays, ops
from . import rainfusion_v2 as rf_v2
from .errors import ParametersInvalid, raises_parameters_invalid, refusing

PRECISIONS = ("bf16", "mix", "fp8")

SPARSE_TYPES = (None, "rf_v2", "rf_v3", "ada_bsa")

_refuse_ada_bsa = refusing("sparse_attention", "sparse_type='ada_bsa' (the NPU's "
                           "sparse_block_estimate block choice)")


@raises_parameters_invalid
def sparse_attention(q, k, v, attn_mask=None, scale=None, is_causal=False, head_num=1,
                     input_layout="BNSD", inner_precise=0, sparse_type=None, txt_len=0,
                     block_size=128, latent_shape_q=None, latent_shape_k=None, video_spans=None,
                     keep_sink=True, keep_recent=True, cdf_threshold=1.0, sparsity=0.0,
                     precision="bf16", **kwargs):
    """MindIE-SD's sparse_attention: q, k, v [B, N, S, D] (input_layout "BNSD") or [B, S, N, D]
    ("BSND"), scale default D ** -0.5; the output in q's layout and dtype.

    sparse_type None: dense attention (GQA and Sq != Sk allowed); attn_mask and is_causal are
    ignored, as MindIE-SD ignores them. "rf_v2": self-attention (q, k, v of one shape) over
    txt_len text tokens followed by one video of latent_shape_q [frames, height, width], or over
    video_spans ([{"start": int, "latent_shape": [T, H, W]}, ...] among other tokens, instead
    of both). In rf_v2's token order (each frame in 8 x 8 tiles, the text after the video) q and
    k are mean-pooled per block_size tokens (64 or 128; MindIE-SD takes 128); query block i
    keeps key block j iff scale * pooled q_i . pooled k_j is at least the K-th largest of its
    row, K = max(1, ceil(blocks * (1 - sparsity))), and the text blocks (the last
    ceil(txt_len / block_size)) and first-frame blocks (the first ceil(height * width /
    block_size)) are kept whole; batch entry 0's choice serves the whole batch, as in
    MindIE-SD. sparsity in [0, 1]; 0 is dense. "rf_v3": the same with each batch entry's own
    choice; precision "bf16" only ("mix", "fp8": FeatureNotSupported). "ada_bsa":
    FeatureNotSupported. attn_mask, is_causal, head_num, inner_precise, latent_shape_k,
    keep_sink, keep_recent, cdf_threshold and **kwargs change nothing (MindIE-SD uses them only
    in ada_bsa or on the NPU). Bad arguments raise ParametersInvalid; q, k or v not a tensor,
    TypeError."""
    _arrays.check_inputs("sparse_attention", q=q, k=k, v=v)
    if input_layout not in ("BSND", "BNSD"):
        raise ParametersInvalid(f"input_layout must be 'BSND' or 'BNSD', got {input_layout!r}.")
    if sparse_type not in SPARSE_TYPES:
        raise ParametersInvalid(f"sparse_type must be None, 'rf_v2', 'rf_v3' or 'ada_bsa', got "
                                f"{sparse_type!r}.")
    if video_spans is not None:
        if sparse_type not in ("rf_v2", "rf_v3"):
            raise ParametersInvalid("video_spans needs sparse_type 'rf_v2' or 'rf_v3'.")
        if txt_len != 0 or latent_shape_q is not None or latent_shape_k is not None:
            raise ParametersInvalid("video_spans excludes txt_len, latent_shape_q and "
                                    "latent_shape_k.")
    if sparse_type is None:
        return ops.attention_forward(q, k, v, None, scale, head_first=input_layout == "BNSD")
    if sparse_type == "ada_bsa":
        _refuse_ada_bsa()
    if sparse_type == "rf_v3":
        return bsa_sparse_attention_v3(q, k, v, latent_shape_q, txt_len=txt_len,
                                       sparsity=sparsity, input_layout=input_layout, scale=scale,
                                       block_size=block_size, video_spans=video_spans,
                                       precision=precision)[0]
    head_first, plan, block_size = rf_v2.checked_plan(q, k, v, input_layout, latent_shape_q,
                                                      txt_len, video_spans, block_size, True)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return rf_v2.rf_attention(q, k, v, plan, rf_v2.checked_sparsity(sparsity), block_size, scale,
                              head_first, shared_mask=True)[0]


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


__all__ = ["sparse_attention", "bsa_sparse_attention_v3"]
