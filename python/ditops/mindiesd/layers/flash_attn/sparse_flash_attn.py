"""MindIE-SD's sparse_attention."""

from .... import _arrays, ops
from ..._unsupported import refusing
from ...utils.exception import ParametersInvalid, raises_parameters_invalid
from . import sparse_flash_attn_rf_v2 as rf_v2
from .sparse_flash_attn_rf_v3 import bsa_sparse_attention_v3

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


__all__ = ["sparse_attention"]
