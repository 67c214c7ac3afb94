"""The operators under MindIE-SD's names and argument conventions, on torch CPU tensors or numpy
arrays (DLPack, no copies, any strides the C++ call accepts). Outputs come back as the inputs'
kind, or are written into `out=`; ditops.Error (a ValueError) carries the C++ message, and
nothing is written when a call is refused."""

from . import _arrays
from . import _ditops as _module
from ._op import Op, call


class _Native:
    """The C++ module's functions, each taking torch tensors as DLPack capsules."""

    def __init__(self):
        for name in dir(_module):
            value = getattr(_module, name)
            is_function = callable(value) and not isinstance(value, type)
            setattr(self, name, _arrays.native(value) if is_function else value)


_ditops = _Native()

# ---- shapes ---------------------------------------------------------------------------------


def _attention_dims(call_name, q, head_first):
    """(B, N, Sq) of a rank-4 query in BSND (or BNSD with head_first)."""
    if len(q.shape) != 4:
        raise _ditops.Error(
            f"{call_name}: query has shape {list(q.shape)}, expected [B, S, N, D] "
            "(or [B, N, S, D] with head_first)"
        )
    b, second, third, _ = q.shape
    return (b, second, third) if head_first else (b, third, second)


def _lse_shape(call_name, q, head_first, wanted):
    return _attention_dims(call_name, q, head_first) if wanted else (0,)


# ---- operator definitions (one per C++ call) ------------------------------------------------

def _attention_out(q, v):
    """attention's output: q's shape with v's head size (None: q's own, the cheapest)."""
    return None if v.shape[-1] == q.shape[-1] else tuple(q.shape[:-1]) + (v.shape[-1],)


_ATTENTION_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? mask, float? scale, bool causal, "
                     "bool head_first, str backend, int int8_chunk)")

_attention = Op(
    "attention_forward",
    _ATTENTION_SCHEMA + " -> Tensor",
    lambda q, k, v, *rest: [(_attention_out(q, v), None)],
    lambda q, k, v, mask, scale, causal, head_first, backend, chunk, out: (
        _ditops.attention_forward(q, k, v, out, mask, None, scale, causal, head_first, backend,
                                  chunk)),
)

_attention_lse = Op(
    "attention_forward_lse",
    _ATTENTION_SCHEMA + " -> (Tensor, Tensor)",
    lambda q, k, v, mask, scale, causal, head_first, *rest: [
        (_attention_out(q, v), None),
        (_attention_dims("attention_forward", q, head_first), "float32")],
    lambda q, k, v, mask, scale, causal, head_first, backend, chunk, out, lse: (
        _ditops.attention_forward(q, k, v, out, mask, lse, scale, causal, head_first, backend,
                                  chunk)),
)

_varlen = Op(
    "attention_forward_varlen",
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, float? scale, "
    "bool causal, str backend) -> Tensor",
    lambda q, k, v, cu_q, cu_k, scale, causal, backend: [(_attention_out(q, v), None)],
    lambda q, k, v, cu_q, cu_k, scale, causal, backend, out: _ditops.attention_forward_varlen(
        q, k, v, cu_q, cu_k, out, None, scale, causal, backend
    ),
)

_rope = Op(
    "rotary_position_embedding",
    "(Tensor x, Tensor cos, Tensor sin, str mode, bool head_first) -> Tensor",
    lambda x, cos, sin, mode, head_first: [(None, None)],
    lambda x, cos, sin, mode, head_first, out: _ditops.rotary_position_embedding(
        x, cos, sin, out, mode, head_first
    ),
)

_rms_norm = Op(
    "rms_norm",
    "(Tensor x, Tensor weight, float eps) -> Tensor",
    lambda x, weight, eps: [(None, None)],
    lambda x, weight, eps, out: _ditops.rms_norm(x, weight, eps, out),
)

_add_rms_norm = Op(
    "add_rms_norm",
    "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    lambda x, residual, weight, eps: [(None, None), (None, None)],
    lambda x, residual, weight, eps, out, total: _ditops.add_rms_norm(
        x, residual, weight, eps, out, total
    ),
)

_cfg_combine = Op(
    "cfg_combine",
    "(Tensor cond, Tensor uncond, float scale) -> Tensor",
    lambda cond, uncond, scale: [(None, None)],
    lambda cond, uncond, scale, out: _ditops.cfg_combine(cond, uncond, scale, out),
)

_merge = Op(
    "merge_attention_states",
    "(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor, Tensor)",
    lambda out_a, lse_a, out_b, lse_b: [(None, None), (tuple(lse_a.shape), "float32")],
    lambda out_a, lse_a, out_b, lse_b, out, lse: _ditops.merge_attention_states(
        out_a, lse_a, out_b, lse_b, out, lse),
)

_block_sparse = Op(
    "block_sparse_attention",
    "(Tensor q, Tensor k, Tensor v, Tensor block_mask, int block_size, float? scale, "
    "bool head_first, bool return_lse) -> (Tensor, Tensor)",
    lambda q, k, v, mask, block_size, scale, head_first, return_lse: [
        (_attention_out(q, v), None),
        (_lse_shape("block_sparse_attention", q, head_first, return_lse), "float32"),
    ],
    lambda q, k, v, mask, block_size, scale, head_first, return_lse, out, lse: (
        _ditops.block_sparse_attention(
            q, k, v, mask, block_size, out, lse if return_lse else None, scale, head_first
        )
    ),
)

_RAINFUSION_SCHEMA = (
    "int frames, int height, int width, int text_tokens, bool text_first, float sparsity, "
    "int textural_stride, float recall_threshold, bool dense_first_frame"
)


def _rainfusion_run(q, k, v, patterns, *rest):
    layout, (scale, head_first, out) = rest[:9], rest[9:]
    rf = _rf(*layout)
    if not patterns:
        patterns = _ditops.rainfusion_classify(q, k, rf, scale, head_first)
    _ditops.rainfusion_attention(q, k, v, list(patterns), out, rf, None, scale, head_first)


def _rf(frames, height, width, text_tokens, text_first, sparsity, stride, recall, first_frame):
    return _ditops.RainFusionOptions(
        frames=frames, height=height, width=width, text_tokens=text_tokens,
        text_first=text_first, sparsity=sparsity, textural_stride=stride,
        recall_threshold=recall, dense_first_frame=first_frame,
    )


_rainfusion = Op(
    "rainfusion_attention",
    f"(Tensor q, Tensor k, Tensor v, str[] patterns, {_RAINFUSION_SCHEMA}, float? scale, "
    "bool head_first) -> Tensor",
    lambda q, k, v, *rest: [(_attention_out(q, v), None)],
    _rainfusion_run,
)


def _adaptive_blocks_shape(q, k, *rest):
    layout, (block_size, scale, head_first) = rest[:9], rest[9:]
    b, n, s = _attention_dims("sparse_attention", q, head_first)
    blocks = -(-s // block_size) if block_size > 0 else 0
    return [((b, n, blocks, blocks), "bool")]


def _adaptive_blocks_run(q, k, *rest):
    layout, (block_size, scale, head_first, mask) = rest[:9], rest[9:]
    _ditops.rainfusion_adaptive_blocks(q, k, _rf(*layout), block_size, mask, scale, head_first)


_adaptive_blocks = Op(
    "rainfusion_adaptive_blocks",
    f"(Tensor q, Tensor k, {_RAINFUSION_SCHEMA}, int block_size, float? scale, bool head_first) "
    "-> Tensor",
    _adaptive_blocks_shape,
    _adaptive_blocks_run,
)

_mla = Op(
    "mla_decode_paged",
    "(Tensor q_nope, Tensor q_rope, Tensor nope, Tensor nope_scale, Tensor rope, "
    "Tensor block_table, Tensor seq_lens, float? scale, int chunk, int num_splits) -> Tensor",
    lambda q_nope, *rest: [(None, None)],
    lambda q_nope, q_rope, nope, nope_scale, rope, table, lens, scale, chunk, splits, out: (
        _ditops.mla_decode_paged(
            q_nope, q_rope, nope, nope_scale, rope, table, lens, out, scale, chunk, splits
        )
    ),
)


# ---- public calls ---------------------------------------------------------------------------


def attention_forward(query, key, value, attn_mask=None, scale=None, fused=True,
                      head_first=False, *, causal=False, return_lse=False, backend="automatic",
                      out=None, int8_chunk=2):
    """MindIE-SD's attention_forward: softmax(scale · q·kᵀ + mask) · v per head, BSND
    (head_first=False) or BNSD, output in the input layout. attn_mask: boolean (True = attend)
    or additive float, [Sq, Sk] or broadcastable [B|1, N|1, Sq|1, Sk]. fused=False runs the
    reference math. Keywords: causal, return_lse (then (out, lse), lse float32 [B, N, Sq]),
    backend (a name of backend_names(), default automatic), out, int8_chunk. GQA: key and value
    may have fewer heads."""
    if not fused:
        backend = "reference"
    _arrays.forbid_grad("attention_forward", query, key, value, attn_mask)
    mask = _arrays.float32_mask(attn_mask)
    return call(_attention_lse if return_lse else _attention, query, key, value, mask, scale,
                causal, head_first, backend, int8_chunk, out=out)


def attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                             max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                             backend="automatic"):
    """MindIE-SD's attention_forward_varlen: packed sequences q [Tq, N, D], k/v [Tk, Nkv, D];
    cu_seqlens_* the prefix sums of the lengths (int32, B + 1 entries). Returns [Tq, N, Dv].
    dropout_p must be 0 (inference); max_seqlen_* are derived from cu_seqlens and only checked."""
    if dropout_p != 0.0:
        raise _ditops.Error(f"attention_forward_varlen: dropout_p ({dropout_p}) must be 0")
    _arrays.forbid_grad("attention_forward_varlen", q, k, v)
    cu_q = _arrays.int32_vector(cu_seqlens_q, q)
    cu_k = _arrays.int32_vector(cu_seqlens_k, q)
    for name, given, cu in (("max_seqlen_q", max_seqlen_q, cu_q), ("max_seqlen_k", max_seqlen_k,
                                                                   cu_k)):
        lengths = [int(b) - int(a) for a, b in zip(cu[:-1], cu[1:])]
        if given is not None and lengths and int(given) < max(lengths):
            raise _ditops.Error(f"attention_forward_varlen: {name} ({given}) is below the "
                                f"longest sequence ({max(lengths)})")
    return call(_varlen, q, k, v, cu_q, cu_k, softmax_scale, causal, backend)


def merge_attention_states(out_a, lse_a, out_b, lse_b, out=None, lse=None):
    """The attention over the union of two disjoint key sets from the attention over each:
    (out, lse) with out = (e^lse_a·out_a + e^lse_b·out_b) / (e^lse_a + e^lse_b) per row and
    lse = log(e^lse_a + e^lse_b). out_* [B, S, N, D] (BSND; a BNSD tensor passes as its
    .transpose(1, 2) view), float32, bfloat16 or float16 each; lse_* float32 [B, N, S]. A row
    whose lse is -inf on one side takes the other side; -inf on both gives 0 and -inf. `out`
    and `lse` (optional) receive the result, and may be out_a / lse_a (or the b side) to merge
    in place; by default out has out_a's dtype."""
    _arrays.forbid_grad("merge_attention_states", out_a, out_b)
    if out is None and lse is None:
        return call(_merge, out_a, lse_a, out_b, lse_b)
    if out is None:
        out = _arrays.empty(out_a, None)
    if lse is None:
        lse = _arrays.empty(lse_a, tuple(lse_a.shape), "float32")
    _ditops.merge_attention_states(out_a, lse_a, out_b, lse_b, out, lse)
    return out, lse


def rotary_position_embedding(x, cos, sin, rotated_mode="rotated_half", head_first=False,
                              fused=True):
    """MindIE-SD's rotary_position_embedding: x · cos + rot(x) · sin, x [B, S, N, D] (or
    [B, N, S, D] with head_first), cos/sin [S, D] or broadcastable. rotated_mode
    "rotated_half" (rot(x) = cat(-x2, x1)) or "rotated_interleaved" ([-x1, x0, -x3, x2, ...]).
    fused=False is accepted for MindIE-SD's signature; both run the same kernel."""
    del fused
    _arrays.forbid_grad("rotary_position_embedding", x, cos, sin)
    return call(_rope, x, cos, sin, rotated_mode, head_first)


def rms_norm(x, weight, eps=1e-6):
    """x / sqrt(mean(x²) + eps) · weight over the last dimension."""
    _arrays.forbid_grad("rms_norm", x, weight)
    return call(_rms_norm, x, weight, float(eps))


def add_rms_norm(x, residual, weight, eps=1e-6):
    """(rms_norm(x + residual, weight, eps), x + residual)."""
    _arrays.forbid_grad("add_rms_norm", x, residual, weight)
    return call(_add_rms_norm, x, residual, weight, float(eps))


def cfg_combine(cond, uncond, scale, out=None):
    """Classifier-free guidance: uncond + scale · (cond - uncond)."""
    _arrays.forbid_grad("cfg_combine", cond, uncond)
    return call(_cfg_combine, cond, uncond, float(scale), out=out)


def block_sparse_attention(q, k, v, block_mask, block_size, head_first=False, scale=None,
                           return_lse=False):
    """Attention over the key blocks block_mask keeps (bool [B|1, N|1, ceil(Sq / block_size),
    ceil(Sk / block_size)]), block_size 64 or 128; cost proportional to the kept blocks."""
    _arrays.forbid_grad("block_sparse_attention", q, k, v)
    out, lse = call(_block_sparse, q, k, v, block_mask, int(block_size), scale, head_first,
                    return_lse)
    return (out, lse) if return_lse else out


def _layout_args(latent_shape, txt_len, text_first, sparsity, textural_stride, recall_threshold,
                 dense_first_frame):
    if latent_shape is None or len(latent_shape) != 3:
        raise _ditops.Error(f"latent_shape ({latent_shape}) must be [frames, height, width] of "
                            "the video tokens")
    frames, height, width = (int(d) for d in latent_shape)
    return (frames, height, width, int(txt_len), bool(text_first), float(sparsity),
            int(textural_stride), float(recall_threshold), bool(dense_first_frame))


def rainfusion_attention(q, k, v, latent_shape, txt_len=0, sparsity=0.64, patterns=None,
                         text_first=True, textural_stride=2, recall_threshold=0.95,
                         dense_first_frame=True, scale=None, head_first=False):
    """RainFusion sparse attention over a video layout (latent_shape [frames, height, width]
    video tokens and txt_len text tokens, text first unless text_first=False). patterns: one of
    "dense", "spatial", "temporal", "textural" per (batch, head); None classifies the heads
    online."""
    _arrays.forbid_grad("rainfusion_attention", q, k, v)
    layout = _layout_args(latent_shape, txt_len, text_first, sparsity, textural_stride,
                          recall_threshold, dense_first_frame)
    return call(_rainfusion, q, k, v, list(patterns or []), *layout, scale, head_first)


def sparse_attention(query, key, value, attn_mask=None, scale=None, is_causal=False, head_num=1,
                     input_layout="BNSD", sparse_type=None, txt_len=0, block_size=128,
                     latent_shape_q=None, latent_shape_k=None, keep_sink=True, keep_recent=True,
                     cdf_threshold=1.0, sparsity=0.0, text_first=True):
    """MindIE-SD's sparse_attention. sparse_type None: dense attention (attention_forward).
    "rf_v2": RainFusion's adaptive blocks: q and k mean-pooled over block_size tokens, every
    query block keeps its (1 - sparsity) share of key blocks of highest pooled score, blocks of
    text tokens (txt_len, first unless text_first=False) and, with keep_sink, of the first
    latent frame kept whole; then block-sparse attention. latent_shape_q [frames, height,
    width]; self-attention only (latent_shape_k equal or None, no mask, not causal).
    keep_recent and cdf_threshold < 1 are not implemented: an Error says so."""
    if input_layout not in ("BNSD", "BSND"):
        raise _ditops.Error(f"sparse_attention: input_layout \"{input_layout}\" is not BNSD or "
                            "BSND")
    head_first = input_layout == "BNSD"
    if sparse_type is None:
        return attention_forward(query, key, value, attn_mask, scale, head_first=head_first,
                                 causal=is_causal)
    if sparse_type != "rf_v2":
        raise _ditops.Error(f"sparse_attention: sparse_type \"{sparse_type}\" is not None or "
                            "\"rf_v2\"")
    if attn_mask is not None or is_causal:
        raise _ditops.Error("sparse_attention: rf_v2 takes no attn_mask and is not causal")
    if latent_shape_k is not None and list(latent_shape_k) != list(latent_shape_q):
        raise _ditops.Error("sparse_attention: rf_v2 is self-attention: latent_shape_k must "
                            "equal latent_shape_q")
    if cdf_threshold < 1.0 or not keep_recent:
        raise _ditops.Error("sparse_attention: rf_v2 with cdf_threshold < 1 or without "
                            "keep_recent is not implemented")
    _arrays.forbid_grad("sparse_attention", query, key, value)
    layout = _layout_args(latent_shape_q, txt_len, text_first, sparsity, 2, 0.95, keep_sink)
    mask = call(_adaptive_blocks, query, key, *layout, int(block_size), scale, head_first)
    out, _ = call(_block_sparse, query, key, value, mask, int(block_size), scale, head_first,
                  False)
    return out


def mla_decode_paged(q_nope, q_rope, nope, nope_scale, rope, block_table, seq_lens, scale=None,
                     chunk=2, num_splits=0):
    """DeepSeek MLA paged decode over an int8 latent cache (see the C++ mla.hpp): q_nope
    [B, H, 512], q_rope [B, H, 64], cache nope int8 [blocks, block_size, 512], nope_scale
    float32 [blocks, block_size, G], rope [blocks, block_size, 64]; returns [B, H, 512]."""
    _arrays.forbid_grad("mla_decode_paged", q_nope, q_rope)
    lens = _arrays.int32_vector(seq_lens, q_nope)
    return call(_mla, q_nope, q_rope, nope, nope_scale, rope, block_table, lens, scale,
                int(chunk), int(num_splits))


def select_attention(query, key, value, attn_mask=None, scale=None, causal=False,
                     head_first=False, backend="automatic"):
    """What attention_forward would run for these arguments: (backend, detail, from_cache)."""
    return _ditops.select_attention(query, key, value, _arrays.float32_mask(attn_mask), scale,
                                    causal, head_first, backend)
