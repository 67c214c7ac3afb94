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



_LAYOUTS = ("BNSD", "BSND", "TND")


def _block_shape(blockshape):
    """The one block size of MindIE-SD's blockshape [query block rows, key block columns]."""
    try:
        rows, columns = (int(extent) for extent in blockshape)
    except (TypeError, ValueError):
        raise ParametersInvalid(f"rain_fusion_attention: blockshape must be [rows, columns], got "
                                f"{blockshape!r}") from None
    if rows != columns or rows not in rf_v2.BLOCK_SIZES:
        raise ParametersInvalid(f"rain_fusion_attention: blockshape {[rows, columns]} must be "
                                f"square with a side in {rf_v2.BLOCK_SIZES} on ditops")
    return rows


def _selection_mask(select_idx, select_num_idx, heads, query_blocks, key_blocks):
    """The bool block mask [rows // query_blocks, N, query_blocks, key_blocks] of MindIE-SD's
    index form: row r of select_idx [rows, N, width] lists, for query block r of its batch entry
    and head n, the kept key blocks in its first select_num_idx[r, n] entries."""
    for name, value in (("select_idx", select_idx), ("select_num_idx", select_num_idx)):
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex():
            raise ParametersInvalid(f"rain_fusion_attention: {name} must be an integer tensor")
    if select_idx.dim() != 3 or select_idx.shape[1] != heads:
        raise ParametersInvalid(f"rain_fusion_attention: select_idx {list(select_idx.shape)} must "
                                f"be [query blocks, heads ({heads}), key blocks]")
    rows, _, width = select_idx.shape
    if tuple(select_num_idx.shape) != (rows, heads):
        raise ParametersInvalid(f"rain_fusion_attention: select_num_idx "
                                f"{list(select_num_idx.shape)} must be [{rows}, {heads}]")
    if rows == 0 or rows % query_blocks:
        raise ParametersInvalid(f"rain_fusion_attention: select_idx has {rows} rows, expected "
                                f"{query_blocks} (one choice for every batch entry) or "
                                f"{query_blocks} per batch entry")
    counts = select_num_idx.to(torch.int64)
    if bool(((counts < 0) | (counts > width)).any()):
        raise ParametersInvalid(f"rain_fusion_attention: select_num_idx must lie in [0, {width}]")
    listed = torch.arange(width) < counts[..., None]
    index = select_idx.to(torch.int64)
    if bool(((index < 0) | (index >= key_blocks))[listed].any()):
        raise ParametersInvalid(f"rain_fusion_attention: a listed key block lies outside [0, "
                                f"{key_blocks})")
    mask = torch.zeros(rows, heads, key_blocks + 1, dtype=torch.bool)
    mask.scatter_(2, torch.where(listed, index, key_blocks), True)
    mask = mask[..., :key_blocks].reshape(rows // query_blocks, query_blocks, heads, key_blocks)
    return mask.permute(0, 2, 1, 3)


def _sequence_lengths(lengths, name, count=None):
    """`lengths` (a list, tuple or tensor of integers) as ints: `count` of them where given,
    each at least 1."""
    try:
        values = [int(length) for length in lengths]
    except (TypeError, ValueError):
        raise ParametersInvalid(f"rain_fusion_attention: {name} must be a list of sequence "
                                f"lengths, got {lengths!r}") from None
    if (count is not None and len(values) != count) or min(values, default=0) < 1:
        raise ParametersInvalid(f"rain_fusion_attention: {name} must hold "
                                f"{'' if count is None else f'{count} '}positive lengths, got "
                                f"{values}")
    return values


def _rain_fusion_padded(q, k, v, select_idx, select_num_idx, block_size, scale, layout,
                        lengths, lengths_kv):
    """BNSD / BSND: every batch entry of the whole padded length (the lengths, where given, must
    be those)."""
    head_first = layout == "BNSD"
    batch = q.shape[0]
    heads, seq = (q.shape[1], q.shape[2]) if head_first else (q.shape[2], q.shape[1])
    seq_kv = k.shape[2] if head_first else k.shape[1]
    for name, given, full in (("actual_seq_lengths", lengths, seq),
                              ("actual_seq_lengths_kv", lengths_kv, seq_kv)):
        if given is not None and any(length != full for length in
                                     _sequence_lengths(given, name, batch)):
            raise ParametersInvalid(f"rain_fusion_attention: {name} must equal the {layout} "
                                    f"tensors' sequence length ({full}) on ditops (no padding)")
    mask = _selection_mask(select_idx, select_num_idx, heads, -(-seq // block_size),
                           -(-seq_kv // block_size))
    if mask.shape[0] not in (1, batch):
        raise ParametersInvalid(f"rain_fusion_attention: select_idx's rows cover {mask.shape[0]} "
                                f"batch entries, the tensors {batch}")
    return ops.block_sparse_attention(q, k, v, mask, block_size, head_first, scale)


def _rain_fusion_packed(q, k, v, select_idx, select_num_idx, block_size, scale, lengths,
                        lengths_kv):
    """TND: the sequences packed one after another, each with its own rows of select_idx."""
    if lengths is None or lengths_kv is None:
        raise ParametersInvalid("rain_fusion_attention: input_layout 'TND' needs "
                                "actual_seq_lengths and actual_seq_lengths_kv")
    lengths = _sequence_lengths(lengths, "actual_seq_lengths")
    lengths_kv = _sequence_lengths(lengths_kv, "actual_seq_lengths_kv", len(lengths))
    if sum(lengths) != q.shape[0] or sum(lengths_kv) != k.shape[0]:
        raise ParametersInvalid(f"rain_fusion_attention: the lengths sum to {sum(lengths)} and "
                                f"{sum(lengths_kv)} tokens; the tensors hold {q.shape[0]} and "
                                f"{k.shape[0]}")
    out = torch.empty(q.shape[:2] + v.shape[2:], dtype=q.dtype)
    row = start = start_kv = 0
    for length, length_kv in zip(lengths, lengths_kv):
        rows = -(-length // block_size)
        mask = _selection_mask(select_idx[row:row + rows], select_num_idx[row:row + rows],
                               q.shape[1], rows, -(-length_kv // block_size))
        piece = slice(start, start + length)
        piece_kv = slice(start_kv, start_kv + length_kv)
        out[piece] = ops.block_sparse_attention(q[None, piece], k[None, piece_kv],
                                                v[None, piece_kv], mask, block_size, False,
                                                scale)[0]
        row, start, start_kv = row + rows, start + length, start_kv + length_kv
    if row != select_idx.shape[0]:
        raise ParametersInvalid(f"rain_fusion_attention: select_idx has {select_idx.shape[0]} "
                                f"rows; the sequences have {row} query blocks")
    return out


@raises_parameters_invalid
def rain_fusion_attention(query, key, value, scale=None, head_num=None, input_layout="TND",
                          select_idx=None, select_num_idx=None, blockshape=None,
                          actual_seq_lengths=None, actual_seq_lengths_kv=None,
                          inner_precise=0):
    """MindIE-SD's RainFusion kernel entry (mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2):
    attention in which query block i of head n attends only to the key blocks
    select_idx[i, n, :select_num_idx[i, n]] (each blockshape[0] x blockshape[1] tokens, the
    last one partial), a query block listing none gives zeros. query, key, value BNSD
    [B, N, S, D], BSND or TND [T, N, D] (sequences packed, their lengths actual_seq_lengths and
    actual_seq_lengths_kv); fewer key heads than query heads (GQA) allowed. select_idx [rows,
    N, width] and select_num_idx [rows, N], integers: one row per query block of each batch
    entry in order (BNSD / BSND may give one batch entry's rows for all, as MindIE-SD's own
    rf_v2 passes them). scale default D ** -0.5. On ditops blockshape is square, 64 or 128, and
    BNSD / BSND sequences are their whole length; head_num and inner_precise change nothing."""
    _arrays.check_inputs("rain_fusion_attention", torch_only=True, query=query, key=key,
                         value=value)
    if input_layout not in _LAYOUTS:
        raise ParametersInvalid(f"rain_fusion_attention: input_layout must be one of {_LAYOUTS}, "
                                f"got {input_layout!r}")
    rank = 3 if input_layout == "TND" else 4
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != rank:
            raise ParametersInvalid(f"rain_fusion_attention: {name} must be a {rank}-D torch "
                                    f"tensor ({input_layout})")
    if select_idx is None or select_num_idx is None or blockshape is None:
        raise ParametersInvalid("rain_fusion_attention: select_idx, select_num_idx and "
                                "blockshape are required")
    block_size = _block_shape(blockshape)
    if input_layout == "TND":
        return _rain_fusion_packed(query, key, value, select_idx, select_num_idx, block_size,
                                   scale, actual_seq_lengths, actual_seq_lengths_kv)
    return _rain_fusion_padded(query, key, value, select_idx, select_num_idx, block_size, scale,
                               input_layout, actual_seq_lengths, actual_seq_lengths_kv)


__all__ = ["sparse_attention", "bsa_sparse_attention_v3", "rain_fusion_attention"]
