"""MindIE-SD's rf_v2 (RainFusion 2) block choice on ditops' block-sparse kernel.

The tokens are put in rf_v2's order (each video's frames regrouped into 8 x 8 spatial tiles, the
other tokens after the video), q and k are mean-pooled per block of that order, every query
block keeps the key blocks of highest pooled score plus the forced ones, and
ops.block_sparse_attention runs the kept blocks; the output comes back in the input's order."""

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from . import _arrays, ops
from .errors import ParametersInvalid

TILE = 8  # tokens per side of a spatial tile
BLOCK_SIZES = (64, 128)  # what ops.block_sparse_attention takes


class Plan(NamedTuple):
    """A token layout in rf_v2's order: order[i] is the input row at position i, inverse its
    inverse permutation; forced marks the blocks kept whole (their rows and columns)."""

    order: torch.Tensor
    inverse: torch.Tensor
    forced: torch.Tensor


def _ceil_div(a, b):
    return -(-a // b)


def _frame_order(height, width):
    """One frame's raster indices in tile order: the 8 x 8 tiles of its largest rectangle of
    multiples of 8 (rows of tiles, each tile row-major), then the rows below that rectangle
    (whole width), then the columns right of it (its height), both row-major."""
    grid = torch.arange(height * width).reshape(height, width)
    tiled_h, tiled_w = height - height % TILE, width - width % TILE
    tiles = grid[:tiled_h, :tiled_w].reshape(tiled_h // TILE, TILE, tiled_w // TILE, TILE)
    return torch.cat([tiles.permute(0, 2, 1, 3).reshape(-1), grid[tiled_h:].reshape(-1),
                      grid[:tiled_h, tiled_w:].reshape(-1)])


def _video_order(frames, height, width):
    """A video's (t, h, w)-ordered tokens in rf_v2's order: every frame in tile order, except
    that the first frame stays in raster order when height or width is not a multiple of 8."""
    frame = height * width
    order = _frame_order(height, width) + frame * torch.arange(frames)[:, None]
    if height % TILE or width % TILE:
        order[0] = torch.arange(frame)
    return order.reshape(-1)


def _plan(order, forced):
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return Plan(order, inverse, forced)


@functools.lru_cache(maxsize=64)
def _video_plan(frames, height, width):
    """One video alone in rf_v2's order, nothing forced (the 3.1.0 helpers' rearrangement)."""
    return _plan(_video_order(frames, height, width), None)


@functools.lru_cache(maxsize=64)
def layout_plan(seq_len, latent_shape, txt_len, text_first, block_size, protect_first_frame):
    """One video of latent_shape (frames, height, width) and txt_len text tokens, before the
    video (text_first, MindIE-SD's txt_len) or after it. In rf_v2's order the text comes after
    the video; forced: the last ceil(txt_len / block_size) blocks and, with
    protect_first_frame, the first ceil(height * width / block_size)."""
    frames, height, width = latent_shape
    video = _video_order(frames, height, width)
    text = torch.arange(txt_len)
    order = torch.cat([video + txt_len, text] if text_first else [video, text + video.numel()])
    forced = torch.zeros(_ceil_div(seq_len, block_size), dtype=torch.bool)
    if protect_first_frame:
        forced[:_ceil_div(height * width, block_size)] = True
    if txt_len:
        forced[forced.numel() - _ceil_div(txt_len, block_size):] = True
    return _plan(order, forced)


def checked_layout(latent_shape_q, txt_len, seq_len):
    """(frames, height, width) of latent_shape_q, checked against txt_len and seq_len."""
    try:
        shape = tuple(int(d) for d in latent_shape_q)
    except TypeError:
        raise ParametersInvalid(f"latent_shape_q must be [frames, height, width], got "
                                f"{latent_shape_q!r}") from None
    if len(shape) != 3 or min(shape) <= 0:
        raise ParametersInvalid(f"latent_shape_q must be three positive integers [frames, "
                                f"height, width], got {latent_shape_q!r}")
    if not isinstance(txt_len, numbers.Integral) or txt_len < 0:
        raise ParametersInvalid(f"txt_len must be a non-negative integer, got {txt_len!r}")
    if txt_len + math.prod(shape) != seq_len:
        raise ParametersInvalid(f"txt_len ({txt_len}) plus the latent_shape_q {list(shape)} "
                                f"video tokens must equal the sequence length ({seq_len})")
    return shape


def checked_spans(video_spans, seq_len):
    """video_spans as ((start, (frames, height, width)), ...): ordered, non-overlapping, inside
    the sequence, at least one."""
    if not isinstance(video_spans, Sequence) or isinstance(video_spans, (str, bytes)):
        raise ParametersInvalid("video_spans must be a sequence of span descriptors.")
    spans, end = [], 0
    for index, span in enumerate(video_spans):
        if not isinstance(span, Mapping):
            raise ParametersInvalid(f"video_spans[{index}] must be a mapping.")
        try:
            start = int(span["start"])
            shape = tuple(int(d) for d in span["latent_shape"])
        except (KeyError, TypeError, ValueError):
            raise ParametersInvalid(f"video_spans[{index}] needs an integer start and "
                                    "latent_shape=[T, H, W].") from None
        if len(shape) != 3 or min(shape) <= 0:
            raise ParametersInvalid(f"video_spans[{index}].latent_shape must be three positive "
                                    "integers.")
        if start < end or start + math.prod(shape) > seq_len:
            raise ParametersInvalid(f"video_spans[{index}] [{start}, {start + math.prod(shape)}) "
                                    "overlaps the span before it or passes the sequence length "
                                    f"({seq_len}).")
        spans.append((start, shape))
        end = start + math.prod(shape)
    if not spans:
        raise ParametersInvalid("video_spans must hold at least one video span.")
    return tuple(spans)


@functools.lru_cache(maxsize=64)
def spans_plan(seq_len, spans, block_size):
    """Several videos (checked_spans) among other tokens (text, images, audio: the context, kept
    in their order). Each video starts on a block of its own: context rows fill the rest of a
    video's last block (such a block is forced) unless it is the last video; the context left
    over comes last, its blocks forced. Each video's first-frame blocks are forced."""
    is_video = torch.zeros(seq_len, dtype=torch.bool)
    for start, shape in spans:
        is_video[start:start + math.prod(shape)] = True
    context = torch.nonzero(~is_video).reshape(-1)
    parts, forced_blocks, used, position = [], [], 0, 0
    for index, (start, (frames, height, width)) in enumerate(spans):
        first = position // block_size
        forced_blocks += range(first, first + _ceil_div(height * width, block_size))
        parts.append(_video_order(frames, height, width) + start)
        position += frames * height * width
        fill = -position % block_size
        if index + 1 < len(spans) and fill:
            if used + fill > context.numel():
                raise ParametersInvalid("rf_v2 with video_spans needs context (non-video) rows to "
                                        "fill each video's last block but the last one's; there "
                                        "are too few: use dense attention (sparse_type=None).")
            forced_blocks.append(position // block_size)
            parts.append(context[used:used + fill])
            used, position = used + fill, position + fill
    parts.append(context[used:])
    forced_blocks += range(position // block_size, _ceil_div(seq_len, block_size))
    forced = torch.zeros(_ceil_div(seq_len, block_size), dtype=torch.bool)
    forced[forced_blocks] = True
    return _plan(torch.cat(parts), forced)


def _block_means(x, block_size, dim):
    """x's means over every block_size entries along `dim`, float32 (the last block: the mean of
    the entries it has)."""
    full = x.shape[dim] // block_size * block_size
    means = [x.narrow(dim, 0, full).unflatten(dim, (-1, block_size)).mean(dim + 1,
                                                                          dtype=torch.float32)]
    if full < x.shape[dim]:
        means.append(x.narrow(dim, full, x.shape[dim] - full).mean(dim, keepdim=True,
                                                                   dtype=torch.float32))
    return torch.cat(means, dim=dim)


def _pooled(x, block_size, head_first):
    """x's per-block means along the sequence, float32 [B, N, blocks, D]."""
    return _block_means(x if head_first else x.transpose(1, 2), block_size, 2)


def _top_blocks(scores, sparsity):
    """Where scores [..., blocks] reach the K-th largest of their row, K = max(1, ceil(blocks *
    (1 - sparsity))) (ties keep more)."""
    blocks = scores.shape[-1]
    keep = min(blocks, max(1, math.ceil(blocks * (1 - sparsity))))
    return scores >= torch.topk(scores, keep, dim=-1).values[..., -1:]


def choose_blocks(q, k, block_size, sparsity, scale, forced, head_first):
    """rf_v2's block mask, bool [B, N, blocks, blocks], of q and k in rf_v2's order: query block
    i keeps key block j iff score(i, j) = scale * pooled q_i . pooled k_j is at least the K-th
    largest of its row, K = max(1, ceil(blocks * (1 - sparsity))) (ties keep more); forced
    blocks are kept in both directions. (MindIE-SD ranks softmax(score), which is the same
    order.)"""
    pooled_q, pooled_k = _pooled(q, block_size, head_first), _pooled(k, block_size, head_first)
    mask = _top_blocks(scale * pooled_q @ pooled_k.transpose(-1, -2), sparsity)
    mask[..., forced, :] = True
    mask[..., forced] = True
    return mask


def checked_qkv(q, k, v, input_layout):
    """head_first and the sequence length of q, k, v: torch tensors of one 4-D shape (rf_v2 and
    rf_v3 permute the three alike)."""
    if input_layout not in ("BSND", "BNSD"):
        raise ParametersInvalid(f"input_layout must be 'BSND' or 'BNSD', got {input_layout!r}.")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ParametersInvalid(f"{name} must be a 4-D torch tensor ({input_layout}).")
    if not q.shape == k.shape == v.shape:
        raise ParametersInvalid(f"q, k and v must have one shape for RainFusion's block "
                                f"choice, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}.")
    head_first = input_layout == "BNSD"
    return head_first, q.shape[2 if head_first else 1]


def checked_sparsity(sparsity):
    if not isinstance(sparsity, numbers.Real) or not 0.0 <= sparsity <= 1.0:
        raise ParametersInvalid(f"sparsity must be a number in [0, 1], got {sparsity!r}")
    return float(sparsity)


def checked_block_size(block_size):
    if block_size not in BLOCK_SIZES:
        raise ParametersInvalid(f"block_size must be one of {BLOCK_SIZES} on ditops (MindIE-SD: "
                                f"128), got {block_size!r}")
    return int(block_size)


def checked_plan(q, k, v, input_layout, latent_shape_q, txt_len, video_spans, block_size,
                 protect_first_frame, text_first=True):
    """(head_first, plan, block_size) of MindIE-SD's rf_v2 / rf_v3 arguments: txt_len text
    tokens, then one video of latent_shape_q (the text after it with text_first=False, a ditops
    extension); or video_spans."""
    head_first, seq_len = checked_qkv(q, k, v, input_layout)
    block_size = checked_block_size(block_size)
    if video_spans is not None:
        return head_first, spans_plan(seq_len, checked_spans(video_spans, seq_len),
                                      block_size), block_size
    shape = checked_layout(latent_shape_q, txt_len, seq_len)
    return head_first, layout_plan(seq_len, shape, int(txt_len), bool(text_first), block_size,
                                   bool(protect_first_frame)), block_size


def rf_attention(q, k, v, plan, sparsity, block_size, scale, head_first, shared_mask,
                 mask=None):
    """(attention over the blocks rf_v2 keeps, block mask) for q, k, v of one shape, BNSD
    (head_first) or BSND, in the layout `plan` describes. shared_mask: batch 0's choice for
    every batch entry (mask [1, N, ...]); mask: a given block mask instead of the choice."""
    dim = 2 if head_first else 1
    q, k, v = (x.index_select(dim, plan.order) for x in (q, k, v))
    if mask is None:
        chosen = slice(0, 1) if shared_mask else slice(None)
        mask = choose_blocks(q[chosen], k[chosen], block_size, sparsity, scale, plan.forced,
                             head_first)
    out = ops.block_sparse_attention(q, k, v, mask, block_size, head_first, scale)
    return out.index_select(dim, plan.inverse), mask


def rainfusion_v2_attention(q, k, v, latent_shape, txt_len, text_first, sparsity,
                            block_size=128, scale=None, head_first=False,
                            protect_first_frame=True):
    """rf_v2's block choice, one mask per batch entry, for one video (latent_shape [frames,
    height, width]) with txt_len text tokens before it (text_first) or after it: ditops'
    diffusers backend, whose models put the text on either side."""
    _, plan, block_size = checked_plan(q, k, v, "BNSD" if head_first else "BSND", latent_shape,
                                       txt_len, None, block_size, protect_first_frame,
                                       text_first)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return rf_attention(q, k, v, plan, checked_sparsity(sparsity), block_size, scale, head_first,
                        shared_mask=False)[0]


# ---- MindIE-SD 3.1.0's helpers in their own forms --------------------------------------------
# Code written against mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2 builds its own block
# choice from these and hands it to rain_fusion_attention (ditops.sparse). input_layout "BSND"
# or "BNSD"; tensors keep their layout and dtype.


def _sequence_dim(input_layout):
    return 1 if input_layout == "BSND" else 2


def avgpool(input_tensor, pool_size=128, input_layout="BNSD"):
    """The mean of every pool_size tokens along the sequence (the last block: of the tokens it
    has), in the input's layout and dtype."""
    _arrays.check_inputs("avgpool", torch_only=True, input_tensor=input_tensor)
    means = _block_means(input_tensor, pool_size, _sequence_dim(input_layout))
    return means.to(input_tensor.dtype)


def get_mask_index(mask):
    """A block mask bool [B, N, S, S] in MindIE-SD's index form: int64 [B, N, S, S], each row's
    kept columns in ascending order, then -1."""
    _arrays.check_inputs("get_mask_index", torch_only=True, mask=mask)
    columns = torch.arange(mask.shape[-1])
    ascending = torch.where(mask, columns, mask.shape[-1]).sort(dim=-1).values
    return torch.where(columns < mask.sum(-1, keepdim=True), ascending, -1)


def _video_shape(latent_shape_q):
    frames, height, width = (int(extent) for extent in latent_shape_q)
    return frames, height, width


def rearrange_with_remaining(tensor, latent_shape_q, latent_shape_k, input_layout):
    """A video's tokens (latent_shape_q: frames, height, width; the whole sequence) in rf_v2's
    order. latent_shape_k changes nothing (3.1.0 reads only the query's)."""
    _arrays.check_inputs("rearrange_with_remaining", torch_only=True, tensor=tensor)
    order = _video_plan(*_video_shape(latent_shape_q)).order
    return tensor.index_select(_sequence_dim(input_layout), order)


def inv_rearrange_with_remaining(tensor, latent_shape_q, latent_shape_k, input_layout):
    """The inverse of rearrange_with_remaining."""
    _arrays.check_inputs("inv_rearrange_with_remaining", torch_only=True, tensor=tensor)
    inverse = _video_plan(*_video_shape(latent_shape_q)).inverse
    return tensor.index_select(_sequence_dim(input_layout), inverse)


def do_tensor_rearrange_pooling(query, key, value, text_len, pool_size, latent_shape_q,
                                latent_shape_k, input_layout):
    """(q, k, v in rf_v2's order, their pooled blocks stacked on the batch dimension) for
    text_len text tokens followed by one video: the video in rf_v2's order, then the text; the
    video and the text pooled each from its own start (a video whose length is not a multiple
    of pool_size has a short last pooled block, as in 3.1.0)."""
    _arrays.check_inputs("do_tensor_rearrange_pooling", torch_only=True, query=query, key=key,
                         value=value)
    dim = _sequence_dim(input_layout)
    tensor = torch.cat((query, key, value), dim=0)
    text = tensor.narrow(dim, 0, text_len)
    video = rearrange_with_remaining(tensor.narrow(dim, text_len, tensor.shape[dim] - text_len),
                                     latent_shape_q, latent_shape_k, input_layout)
    pooled = avgpool(video, pool_size, input_layout)
    if text_len:
        pooled = torch.cat((pooled, avgpool(text, pool_size, input_layout)), dim=dim)
        video = torch.cat((video, text), dim=dim)
    query, key, value = torch.chunk(video, 3, dim=0)
    return query, key, value, pooled


def do_tensor_inv_rearrange(tensor, text_len, latent_shape_q, latent_shape_k, input_layout):
    """The inverse of do_tensor_rearrange_pooling's order: the text back in front, the video
    in its own order."""
    _arrays.check_inputs("do_tensor_inv_rearrange", torch_only=True, tensor=tensor)
    dim = _sequence_dim(input_layout)
    video = tensor.narrow(dim, 0, tensor.shape[dim] - text_len)
    video = inv_rearrange_with_remaining(video, latent_shape_q, latent_shape_k, input_layout)
    if not text_len:
        return video
    return torch.cat((tensor.narrow(dim, tensor.shape[dim] - text_len, text_len), video), dim)


def get_blockwise_mask(qkv_pool, txt_len, sparsity, scale, pool_size, latent_shape_q,
                       latent_shape_k, input_layout, return_binary=False,
                       protect_first_frame=True):
    """rf_v2's choice over pooled blocks (qkv_pool: do_tensor_rearrange_pooling's): query block
    i keeps key block j where softmax_j(scale * q_i . k_j) (in the pooled dtype) is at least the
    K-th largest of its row, K = max(1, ceil(blocks * (1 - sparsity))); the text blocks (the
    last ceil(txt_len / pool_size)) and, with protect_first_frame, the first frame's (the first
    ceil(height * width / pool_size)) kept both ways. return_binary: the mask, int8 [B, N,
    blocks, blocks]; else batch entry 0's index form for rain_fusion_attention: (select_idx
    [blocks, N, blocks], select_num_idx [blocks, N])."""
    _arrays.check_inputs("get_blockwise_mask", torch_only=True, qkv_pool=qkv_pool)
    pooled_q, pooled_k, _ = torch.chunk(qkv_pool, 3, dim=0)
    if input_layout == "BSND":
        pooled_q, pooled_k = pooled_q.transpose(1, 2), pooled_k.transpose(1, 2)
    scores = torch.softmax(pooled_q @ pooled_k.transpose(-1, -2) * scale, dim=-1)
    mask = _top_blocks(scores, sparsity)
    _, height, width = _video_shape(latent_shape_q)
    kept = [range(mask.shape[-1] - _ceil_div(txt_len, pool_size), mask.shape[-1])]
    if protect_first_frame:
        kept.append(range(_ceil_div(height * width, pool_size)))
    for blocks in kept:
        mask[..., blocks, :] = True
        mask[..., blocks] = True
    if return_binary:
        return mask.to(torch.int8)
    return get_mask_index(mask)[0].transpose(0, 1), mask[0].transpose(0, 1).sum(dim=-1)
