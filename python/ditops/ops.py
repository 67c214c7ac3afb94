"""The operators under MindIE-SD's names and argument conventions, on torch CPU tensors or numpy
arrays (DLPack, no copies, any strides the C++ call accepts). Outputs come back as the inputs'
kind, or are written into `out=`; ditops.Error (a ValueError) carries the C++ message, and
nothing is written when a call is refused."""

import os

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

_attention_op = Op(
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

_norm_rope = Op(
    "rms_norm_rotary_position_embedding",
    "(Tensor x, Tensor? weight, float eps, Tensor cos, Tensor sin, str mode, bool head_first) "
    "-> Tensor",
    lambda x, weight, eps, cos, sin, mode, head_first: [(None, None)],
    lambda x, weight, eps, cos, sin, mode, head_first, out: (
        _ditops.rms_norm_rotary_position_embedding(x, weight, eps, cos, sin, out, mode,
                                                   head_first)),
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

# layer_norm's kernel: plain LayerNorm when scale and shift are None, else AdaLN.
_layer_norm = Op(
    "layer_norm_scale_shift",
    "(Tensor x, Tensor? weight, Tensor? bias, Tensor? scale, Tensor? shift, float eps) -> Tensor",
    lambda x, *rest: [(None, None)],
    lambda x, weight, bias, scale, shift, eps, out: _ditops.layer_norm_scale_shift(
        x, weight, bias, scale, shift, eps, out),
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


def _attention(query, key, value, mask, scale, causal, head_first, backend, return_lse, out,
               int8_chunk):
    """ditops' own attention semantics: mask None, boolean (True = attend) or additive float;
    causal bottom-right aligned. Checked here as well as in the public calls: the diffusers
    backend calls it directly."""
    _arrays.check_inputs("attention_forward", ("attn_mask",), query=query, key=key, value=value,
                         attn_mask=mask)
    mask = _arrays.float32_mask(mask)
    return call(_attention_lse if return_lse else _attention_op, query, key, value, mask, scale,
                causal, head_first, backend, int8_chunk, out=out)


_OP_TYPES = ("prompt_flash_attn", "fused_attn_score", "ascend_laser_attention")
_ATTENTION_KEYWORDS = {"causal": False, "return_lse": False, "backend": "automatic", "out": None,
                       "int8_chunk": 2, "opt_mode": "runtime", "op_type": "fused_attn_score",
                       "layout": "BNSD"}


def _attention_options(kwargs):
    """attention_forward's keywords with their defaults; MindIE-SD's NPU dispatch choices
    (opt_mode, op_type, layout) are checked as MindIE-SD checks them and then have no effect:
    on the CPU the tuner picks the kernel, and the input layout is head_first's."""
    unknown = set(kwargs) - set(_ATTENTION_KEYWORDS)
    if unknown:
        raise TypeError(f"attention_forward() got unexpected keyword arguments {sorted(unknown)}")
    options = {**_ATTENTION_KEYWORDS, **kwargs}
    if options["opt_mode"] not in ("runtime", "static", "manual"):
        raise _ditops.Error(f"attention_forward: opt_mode \"{options['opt_mode']}\" is not "
                            "runtime, static or manual")
    if options["opt_mode"] == "manual":
        op_type = os.environ.get("MINDIE_SD_FA_TYPE") or options["op_type"]
        if op_type not in _OP_TYPES:
            raise _ditops.Error(f"attention_forward: op_type \"{op_type}\" is not one of "
                                f"{', '.join(_OP_TYPES)}")
        if options["layout"] not in ("BNSD", "BSND", "BSH"):
            raise _ditops.Error(f"attention_forward: layout \"{options['layout']}\" is not "
                                "BNSD, BSND or BSH")
    return options


def _keep_mask(attn_mask):
    """MindIE-SD's mask meaning: any nonzero element attends, whatever the dtype."""
    if attn_mask is None or attn_mask.dtype in (bool, _arrays.np.bool_) or (
            _arrays.is_torch(attn_mask) and attn_mask.dtype == _arrays.torch.bool):
        return attn_mask
    return attn_mask != 0


def attention_forward(query, key, value, attn_mask=None, scale=None, fused=True,
                      head_first=False, **kwargs):
    """MindIE-SD's attention_forward: softmax(scale · q·kᵀ, masked) · v per head, BSND
    (head_first=False) or BNSD, output in the input layout. attn_mask of any dtype, nonzero =
    attend (MindIE-SD's meaning; for an additive mask use scaled_dot_product_attention),
    [Sq, Sk] or broadcastable [B|1, N|1, Sq|1, Sk]. fused=False runs the reference math.
    Keywords: causal (bottom-right aligned), return_lse (then (out, lse), lse float32
    [B, N, Sq]), backend (a name of backend_names(), default automatic), out, int8_chunk; and
    MindIE-SD's opt_mode, op_type, layout (checked, then the tuner chooses the kernel). GQA: key
    and value may have fewer heads."""
    options = _attention_options(kwargs)
    _arrays.check_inputs("attention_forward", ("attn_mask", "out"), query=query, key=key,
                         value=value, attn_mask=attn_mask, out=options["out"])
    for name, value_ in (("query", query), ("key", key), ("value", value)):
        if len(value_.shape) != 4:
            raise _ditops.Error(f"attention_forward: {name} has rank {len(value_.shape)}, "
                                "expected rank 4 (BSND, or BNSD with head_first)")
    if not isinstance(fused, bool):
        raise _ditops.Error(f"attention_forward: fused must be a bool, got {type(fused).__name__}")
    if scale is not None and not isinstance(scale, (float, int)):
        raise _ditops.Error(f"attention_forward: scale must be a float, got "
                            f"{type(scale).__name__}")
    backend = options["backend"] if fused else "reference"
    return _attention(query, key, value, _keep_mask(attn_mask), scale, options["causal"],
                      head_first, backend, options["return_lse"], options["out"],
                      options["int8_chunk"])


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's semantics on ditops' kernels: BNSD
    ([..., N, S, D] with one batch dimension), attn_mask boolean (True = attend) or additive
    float, broadcastable to [B, N, Sq, Sk]; is_causal top-left aligned (query i attends keys
    0..i), not together with attn_mask; key/value with fewer heads only with enable_gqa;
    dropout_p must be 0 (inference)."""
    _arrays.check_inputs("scaled_dot_product_attention", ("attn_mask",), query=query, key=key,
                         value=value, attn_mask=attn_mask)
    if dropout_p != 0.0:
        raise _ditops.Error(f"scaled_dot_product_attention: dropout_p ({dropout_p}) must be 0")
    if is_causal and attn_mask is not None:
        raise _ditops.Error("scaled_dot_product_attention: attn_mask and is_causal are exclusive")
    if len(query.shape) != 4 or len(key.shape) != 4:
        raise _ditops.Error(f"scaled_dot_product_attention: query {list(query.shape)} and key "
                            f"{list(key.shape)} must be [B, N, S, D]")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise _ditops.Error(f"scaled_dot_product_attention: key has {key.shape[1]} heads, query "
                            f"{query.shape[1]}: pass enable_gqa=True for grouped-query attention")
    sq, sk = query.shape[2], key.shape[2]
    causal = False
    if is_causal:
        if sq == sk:
            causal = True  # top-left and bottom-right agree
        elif _arrays.is_torch(query):
            attn_mask = _arrays.torch.ones(sq, sk, dtype=_arrays.torch.bool).tril()
        else:
            attn_mask = _arrays.np.tril(_arrays.np.ones((sq, sk), dtype=bool))
    return _attention(query, key, value, attn_mask, scale, causal, True, "automatic", False, None,
                      2)


def attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                             max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=None, softcap=None, alibi_slopes=None,
                             deterministic=None, return_attn_probs=None, block_table=None, *,
                             backend="automatic"):
    """MindIE-SD's attention_forward_varlen: packed sequences q [Tq, N, D], k/v [Tk, Nkv, D];
    cu_seqlens_* the prefix sums of the lengths (int32, B + 1 entries). Returns [Tq, N, Dv].
    causal is bottom-right aligned per sequence. dropout_p must be 0 (inference); max_seqlen_*
    are derived from cu_seqlens and only checked; MindIE-SD's reserved window_size, softcap,
    alibi_slopes, deterministic, return_attn_probs and block_table must be None."""
    reserved = {"window_size": window_size, "softcap": softcap, "alibi_slopes": alibi_slopes,
                "deterministic": deterministic, "return_attn_probs": return_attn_probs,
                "block_table": block_table}
    given = [name for name, value in reserved.items() if value is not None]
    if given:
        raise _ditops.Error(f"attention_forward_varlen: {', '.join(given)} not supported (MindIE-SD "
                            "reserves them): pass None")
    if dropout_p != 0.0:
        raise _ditops.Error(f"attention_forward_varlen: dropout_p ({dropout_p}) must be 0")
    _arrays.check_inputs("attention_forward_varlen", q=q, k=k, v=v)
    cu_q = _arrays.int32_vector(cu_seqlens_q, q, "attention_forward_varlen", "cu_seqlens_q")
    cu_k = _arrays.int32_vector(cu_seqlens_k, q, "attention_forward_varlen", "cu_seqlens_k")
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
    _arrays.check_inputs("merge_attention_states", ("out", "lse"), out_a=out_a, lse_a=lse_a,
                         out_b=out_b, lse_b=lse_b, out=out, lse=lse)
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
    [B, N, S, D] with head_first), or any 4-D x with 4-D cos/sin broadcastable to it ([S, B, N, D]
    with [S, 1, 1, D]); cos/sin [S, D] follow x's sequence dimension. rotated_mode
    "rotated_half" (rot(x) = cat(-x2, x1)) or "rotated_interleaved" ([-x1, x0, -x3, x2, ...]).
    Computed in fp32 whatever cos's float dtype (MindIE-SD computes in cos's dtype), returned in
    x's. fused=False is accepted for MindIE-SD's signature; both run the same kernel."""
    del fused
    _arrays.check_inputs("rotary_position_embedding", x=x, cos=cos, sin=sin)
    if len(cos.shape) != len(sin.shape) or len(cos.shape) not in (2, 4):
        raise _ditops.Error(f"rotary_position_embedding: cos {list(cos.shape)} and sin "
                            f"{list(sin.shape)} must both be [S, D] or 4-D")
    cos, sin = (_arrays.float32_table(table, x) for table in (cos, sin))
    return call(_rope, x, cos, sin, rotated_mode, head_first)


def rms_norm(x, weight, eps=1e-6):
    """x / sqrt(mean(x²) + eps) · weight over the last dimension."""
    _arrays.check_inputs("rms_norm", x=x, weight=weight)
    return call(_rms_norm, x, weight, float(eps))


def rms_norm_rotary_position_embedding(x, weight, cos, sin, eps=1e-6,
                                       rotated_mode="rotated_half", head_first=False, out=None):
    """rotary_position_embedding(rms_norm(x, weight, eps), cos, sin, rotated_mode, head_first)
    in one pass: the q/k RMSNorm of DiT attention and the rotary embedding after it, computed
    in fp32 and rounded once to x's dtype. weight [D] normalizes each head (FLUX); [N · D] each
    token's N heads together (Wan; x [B, S, N, D] with each token's heads contiguous, as
    .unflatten(2, (N, D)) of a projection gives); None: each head, unweighted. x, cos, sin,
    rotated_mode and head_first as rotary_position_embedding; `out` (optional, may be x)
    receives the result."""
    _arrays.check_inputs("rms_norm_rotary_position_embedding", ("weight", "out"), x=x,
                         weight=weight, cos=cos, sin=sin, out=out)
    if len(cos.shape) != len(sin.shape) or len(cos.shape) not in (2, 4):
        raise _ditops.Error(f"rms_norm_rotary_position_embedding: cos {list(cos.shape)} and sin "
                            f"{list(sin.shape)} must both be [S, D] or 4-D")
    cos, sin = (_arrays.float32_table(table, x) for table in (cos, sin))
    return call(_norm_rope, x, weight, float(eps), cos, sin, rotated_mode, head_first, out=out)


def layer_norm(x, weight=None, bias=None, eps=1e-5, scale=None, shift=None):
    """LayerNorm over x's last dimension D: (x - mean) / sqrt(var + eps) · weight + bias, each
    row's statistics in fp32, one rounding to x's dtype (float32, bfloat16 or float16). weight
    and bias [D] (float32 or x's dtype) or None. With scale and shift (AdaLN, given together,
    of one dtype, x's rank, leading extents x's or 1): then · (1 + scale) + shift."""
    _arrays.check_inputs("layer_norm", ("weight", "bias", "scale", "shift"), x=x,
                         weight=weight, bias=bias, scale=scale, shift=shift)
    if (scale is None) != (shift is None):
        raise _ditops.Error("layer_norm: scale and shift must be given together")
    return call(_layer_norm, x, weight, bias, scale, shift, float(eps))


def add_rms_norm(x, residual, weight, eps=1e-6):
    """(rms_norm(x + residual, weight, eps), x + residual)."""
    _arrays.check_inputs("add_rms_norm", x=x, residual=residual, weight=weight)
    return call(_add_rms_norm, x, residual, weight, float(eps))


def cfg_combine(cond, uncond, scale, out=None):
    """Classifier-free guidance: uncond + scale · (cond - uncond)."""
    _arrays.check_inputs("cfg_combine", ("out",), cond=cond, uncond=uncond, out=out)
    return call(_cfg_combine, cond, uncond, float(scale), out=out)


def block_sparse_attention(q, k, v, block_mask, block_size, head_first=False, scale=None,
                           return_lse=False):
    """Attention over the key blocks block_mask keeps (bool [B|1, N|1, ceil(Sq / block_size),
    ceil(Sk / block_size)]), block_size 64 or 128; cost proportional to the kept blocks."""
    _arrays.check_inputs("block_sparse_attention", q=q, k=k, v=v, block_mask=block_mask)
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
    _arrays.check_inputs("rainfusion_attention", q=q, k=k, v=v)
    layout = _layout_args(latent_shape, txt_len, text_first, sparsity, textural_stride,
                          recall_threshold, dense_first_frame)
    return call(_rainfusion, q, k, v, list(patterns or []), *layout, scale, head_first)


def mla_decode_paged(q_nope, q_rope, nope, nope_scale, rope, block_table, seq_lens, scale=None,
                     chunk=2, num_splits=0):
    """DeepSeek MLA paged decode over an int8 latent cache (see the C++ mla.hpp): q_nope
    [B, H, 512], q_rope [B, H, 64], cache nope int8 [blocks, block_size, 512], nope_scale
    float32 [blocks, block_size, G], rope [blocks, block_size, 64]; returns [B, H, 512]."""
    _arrays.check_inputs("mla_decode_paged", q_nope=q_nope, q_rope=q_rope, nope=nope,
                         nope_scale=nope_scale, rope=rope, block_table=block_table)
    lens = _arrays.int32_vector(seq_lens, q_nope, "mla_decode_paged", "seq_lens")
    return call(_mla, q_nope, q_rope, nope, nope_scale, rope, block_table, lens, scale,
                int(chunk), int(num_splits))


def select_attention(query, key, value, attn_mask=None, scale=None, causal=False,
                     head_first=False, backend="automatic"):
    """What attention_forward would run for these arguments: (backend, detail, from_cache)."""
    _arrays.check_inputs("select_attention", ("attn_mask",), query=query, key=key, value=value,
                         attn_mask=attn_mask)
    return _ditops.select_attention(query, key, value, _arrays.float32_mask(attn_mask), scale,
                                    causal, head_first, backend)
