"""Every operator against torch's own math in float64 (conftest.reference_attention and the
formulas of docs/operators.md): dtypes, layouts, masks, strided and sliced inputs, out=, numpy
arrays, bad inputs (ValueError, nothing written), the torch.library registrations (opcheck),
the gradient refusal and the GIL released while a kernel runs."""

import math
import threading
import time

import numpy as np
import pytest
import torch

import ditops
from conftest import close, reference_attention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# ---- attention -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_first", [False, True], ids=["BSND", "BNSD"])
def test_attention_matches_reference(dtype, head_first, threads):
    b, sq, sk, n, d = 2, 67, 131, 3, 64
    shape = (b, n, sq, d) if head_first else (b, sq, n, d)
    kv_shape = (b, n, sk, d) if head_first else (b, sk, n, d)
    q, k, v = randn(*shape, dtype=dtype), randn(*kv_shape, dtype=dtype), randn(*kv_shape,
                                                                             dtype=dtype)
    out, lse = ditops.attention_forward(q, k, v, head_first=head_first, return_lse=True)
    want, want_lse = reference_attention(q, k, v, head_first=head_first)
    assert out.dtype == dtype and out.shape == q.shape
    close(out, want)
    # docs/operators.md's LSE bound: 2e-4, or 1e-2 where 16-bit inputs take bf16 dot products
    # (flash_bf16, which the tuner may pick for bf16 and f16).
    lse_atol = 2e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(lse.double(), want_lse, atol=lse_atol, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_masks_scale_gqa(causal):
    b, sq, sk, n, kv_n, d = 1, 40, 72, 4, 2, 32
    q, k, v = randn(b, sq, n, d), randn(b, sk, kv_n, d), randn(b, sk, kv_n, d)
    keep = torch.rand(sq, sk) > 0.3
    keep[:, -1] = True  # every row keeps a key (causal keeps the last one too)
    broadcast = torch.rand(1, n, sq, sk) > 0.3
    broadcast[..., -1] = True
    for mask in (None, keep, broadcast):
        out = ditops.attention_forward(q, k, v, mask, scale=0.3, causal=causal)
        want, _ = reference_attention(q, k, v, mask, scale=0.3, causal=causal)
        close(out, want)
    # MindIE-SD's meaning for masks of other dtypes: nonzero attends (the value does not matter).
    for nonzero in (keep.float() * 3.5, keep.to(torch.bfloat16) * -1, keep.to(torch.int32)):
        out = ditops.attention_forward(q, k, v, nonzero, scale=0.3, causal=causal)
        want, _ = reference_attention(q, k, v, keep, scale=0.3, causal=causal)
        close(out, want)


def test_attention_on_views_and_numpy():
    # q, k and v as slices of one fused projection (strided rows), a BSND view of a BNSD tensor.
    qkv = randn(2, 50, 3, 4, 32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.is_contiguous()
    want, _ = reference_attention(q, k, v)
    close(ditops.attention_forward(q, k, v), want)
    bnsd = randn(2, 4, 50, 32)
    close(ditops.attention_forward(bnsd.transpose(1, 2), k, v),
          reference_attention(bnsd.transpose(1, 2), k, v)[0])
    # numpy in, numpy out
    out = ditops.attention_forward(q.numpy(), k.numpy(), v.numpy())
    assert isinstance(out, np.ndarray)
    close(torch.from_numpy(out), want)


def test_attention_out_is_written_in_place():
    q, k, v = randn(1, 33, 2, 16), randn(1, 33, 2, 16), randn(1, 33, 2, 16)
    out = torch.empty_like(q)
    pointer = out.data_ptr()
    result = ditops.attention_forward(q, k, v, out=out)
    assert result is out and out.data_ptr() == pointer
    close(out, reference_attention(q, k, v)[0])
    # An output row slice of a larger buffer: written where it lies.
    wide = torch.zeros(1, 33, 4, 16)
    ditops.attention_forward(q, k, v, out=wide[:, :, 1:3])
    close(wide[:, :, 1:3], reference_attention(q, k, v)[0])
    assert torch.all(wide[:, :, 0] == 0) and torch.all(wide[:, :, 3] == 0)


def test_attention_backends_and_reference_math():
    q, k, v = randn(1, 64, 2, 32), randn(1, 64, 2, 32), randn(1, 64, 2, 32)
    want, _ = reference_attention(q, k, v)
    for backend in ("reference", "flash"):
        close(ditops.attention_forward(q, k, v, backend=backend), want)
    close(ditops.attention_forward(q, k, v, fused=False), want)
    chosen, detail, _ = ditops.select_attention(q, k, v)
    assert chosen in ditops.backend_names() and detail


def test_bad_arguments_raise_and_write_nothing():
    q, k, v = randn(1, 16, 2, 8), randn(1, 16, 2, 8), randn(1, 16, 2, 8)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match="attention_forward"):
        ditops.attention_forward(q, k[:, :5], v, out=out)  # k and v of different lengths
    assert torch.all(out == 7.0)
    with pytest.raises(ValueError, match="overlap"):
        ditops.attention_forward(q, k, v, out=q)
    with pytest.raises(ValueError, match="backend"):
        ditops.attention_forward(q, k, v, backend="fastest")
    with pytest.raises(ValueError):
        ditops.attention_forward(q.to(torch.float64), k, v)
    with pytest.raises(ValueError, match="rank 4|shape"):
        ditops.attention_forward(q[0], k[0], v[0], return_lse=True)
    with pytest.raises(TypeError):
        ditops.attention_forward(q, k, v, window=3)
    assert issubclass(ditops.Error, ValueError)


def test_varlen_matches_each_sequence():
    lengths_q, lengths_k = [5, 17, 1], [9, 17, 30]
    n, kv_n, d = 4, 2, 32
    q, k, v = randn(sum(lengths_q), n, d), randn(sum(lengths_k), kv_n, d), randn(
        sum(lengths_k), kv_n, d)
    cu_q = np.cumsum([0] + lengths_q)
    cu_k = np.cumsum([0] + lengths_k)
    for causal in (False, True):
        out = ditops.attention_forward_varlen(q, k, v, cu_q, cu_k, max(lengths_q),
                                              max(lengths_k), causal=causal)
        for i in range(3):
            rows = slice(cu_q[i], cu_q[i + 1])
            keys = slice(cu_k[i], cu_k[i + 1])
            want, _ = reference_attention(q[None, rows], k[None, keys], v[None, keys],
                                          causal=causal)
            close(out[rows], want[0])
    with pytest.raises(ValueError, match="dropout_p"):
        ditops.attention_forward_varlen(q, k, v, cu_q, cu_k, dropout_p=0.1)


# ---- rope, norms, guidance ---------------------------------------------------------------------


def rope_reference(x, cos, sin, interleaved, head_first):
    x64 = x.double()
    if interleaved:
        rotated = torch.stack((-x64[..., 1::2], x64[..., 0::2]), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x64[..., half:], x64[..., :half]), dim=-1)
    shape = (1, 1, *cos.shape) if head_first else (1, cos.shape[0], 1, cos.shape[1])
    return x64 * cos.double().reshape(shape) + rotated * sin.double().reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["rotated_half", "rotated_interleaved"])
@pytest.mark.parametrize("head_first", [False, True], ids=["BSND", "BNSD"])
def test_rope_matches_formula(dtype, mode, head_first):
    s, n, d = 37, 3, 64
    x = randn(*((2, n, s, d) if head_first else (2, s, n, d)), dtype=dtype)
    angles = torch.rand(s, d // 2) * 6
    if mode == "rotated_half":
        angles = torch.cat((angles, angles), dim=-1)
    else:
        angles = angles.repeat_interleave(2, dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    out = ditops.rotary_position_embedding(x, cos, sin, rotated_mode=mode, head_first=head_first)
    close(out, rope_reference(x, cos, sin, mode == "rotated_interleaved", head_first))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norms_match_formula(dtype, threads):
    x, residual = randn(3, 29, 200, dtype=dtype), randn(3, 29, 200, dtype=dtype)
    weight = randn(200, dtype=dtype)

    def reference(h):
        h = h.double()
        return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()

    close(ditops.rms_norm(x, weight), reference(x))
    out, total = ditops.add_rms_norm(x, residual, weight)
    close(total, x.double() + residual.double())
    close(out, reference(x.double() + residual.double()), dtype)
    module = ditops.RMSNorm(200, eps=1e-6, dtype=dtype)
    module.weight.copy_(weight)
    close(module(x), reference(x))
    # A strided input: every other row.
    close(ditops.rms_norm(x[:, ::2], weight), reference(x[:, ::2]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["rotated_half", "rotated_interleaved"])
@pytest.mark.parametrize("group", ["head", "token", "none"])
def test_rms_norm_rope_matches_torch_composition(dtype, mode, group, threads):
    """The fused op against torch's RMSNorm over each head ([D] weight) or each token's heads
    ([N * D] weight, as Wan's q/k norm), then the rotary embedding, all in fp64."""
    b, s, n, d = 2, 37, 3, 64
    x = randn(b, s, n, d, dtype=dtype)
    weight = None if group == "none" else (torch.rand(d if group == "head" else n * d) + 0.5).to(
        dtype)
    angles = torch.rand(s, d // 2) * 6
    angles = (torch.cat((angles, angles), dim=-1) if mode == "rotated_half"
              else angles.repeat_interleave(2, dim=-1))
    cos, sin = angles.cos(), angles.sin()
    x64 = x.double() if group != "token" else x.double().flatten(2)
    norm = torch.nn.RMSNorm(x64.shape[-1], eps=1e-6, elementwise_affine=weight is not None,
                            dtype=torch.float64)
    if weight is not None:
        norm.weight.data.copy_(weight.double())
    with torch.no_grad():
        normalized = norm(x64).reshape(b, s, n, d)
    want = rope_reference(normalized, cos, sin, mode == "rotated_interleaved", False)
    got = ditops.rms_norm_rotary_position_embedding(x, weight, cos, sin, 1e-6, mode)
    assert got.dtype == dtype
    close(got, want)
    # In place, and on tables of x's dtype.
    got = ditops.rms_norm_rotary_position_embedding(x.clone(), weight, cos.to(dtype),
                                                    sin.to(dtype), 1e-6, mode)
    close(got, rope_reference(normalized, cos.to(dtype), sin.to(dtype),
                              mode == "rotated_interleaved", False))
    inplace = x.clone()
    assert ditops.rms_norm_rotary_position_embedding(inplace, weight, cos, sin, 1e-6, mode,
                                                     out=inplace) is inplace
    close(inplace, want)


def test_rms_norm_rope_refuses_heads_that_are_not_contiguous():
    x = randn(1, 4, 2, 16)[:, :, :, :8]  # each head 8 of 16 values: head stride 16
    with pytest.raises(ditops.Error, match="x.strides\\[2\\] \\(16\\) must be D \\(8\\)"):
        ditops.rms_norm_rotary_position_embedding(x, torch.ones(16), torch.ones(4, 8),
                                                  torch.zeros(4, 8))


def test_cfg_combine():
    cond, uncond = randn(2, 16, 300), randn(2, 16, 300)
    want = uncond.double() + 4.5 * (cond.double() - uncond.double())
    close(ditops.cfg_combine(cond, uncond, 4.5), want)
    out = torch.empty_like(cond)
    assert ditops.cfg_combine(cond, uncond, 4.5, out=out) is out
    close(out, want)


def test_merge_attention_states_matches_fp64_with_empty_sides():
    out_a, out_b = randn(2, 7, 3, 40), randn(2, 7, 3, 40, dtype=torch.bfloat16)
    lse_a, lse_b = 3 * torch.randn(2, 3, 7), 3 * torch.randn(2, 3, 7)
    lse_a[0, 0, :3] = -math.inf            # a side with no key: the other side exactly
    lse_b[1, 2, 2:6] = -math.inf
    lse_a[1, 1, 6] = lse_b[1, 1, 6] = -math.inf  # no key on either side: 0 and -inf
    out_b[1, 5, 2] = math.nan              # (b, s, n) = (1, 5, 2) has lse_b -inf: not read
    a, b = lse_a.double(), lse_b.double()
    top = torch.maximum(a, b).nan_to_num(neginf=0.0)
    wa, wb = (a - top).exp(), (b - top).exp()
    total = wa + wb

    def weight(w):
        return (w / total).nan_to_num(0.0).transpose(1, 2).unsqueeze(-1)

    want = weight(wa) * out_a.double() + weight(wb) * out_b.double().nan_to_num(0.0)
    want_lse = top + total.log()
    out, lse = ditops.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert out.dtype == torch.float32 and lse.shape == (2, 3, 7)
    close(out, want)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=1e-6)
    assert torch.equal(out[0, :3, 0], out_b[0, :3, 0].float())
    assert torch.equal(lse[0, 0, :3], lse_b[0, 0, :3])
    assert torch.all(out[1, 6, 1] == 0) and lse[1, 1, 6] == -math.inf
    # In place into the a side, and on numpy arrays.
    a_copy, lse_copy = out_a.clone(), lse_a.clone()
    ditops.merge_attention_states(a_copy, lse_copy, out_b, lse_b, out=a_copy, lse=lse_copy)
    assert torch.equal(a_copy, out) and torch.equal(lse_copy, lse)
    np_out, np_lse = ditops.merge_attention_states(out_a.numpy(), lse_a.numpy(),
                                                   out_b.float().numpy(), lse_b.numpy())
    close(torch.from_numpy(np_out), want)
    # BNSD tensors as their transposed views.
    out_t, _ = ditops.merge_attention_states(out_a.transpose(1, 2).contiguous().transpose(1, 2),
                                             lse_a, out_b, lse_b)
    assert torch.equal(out_t, out)
    with pytest.raises(ditops.Error, match="lse_b"):
        ditops.merge_attention_states(out_a, lse_a, out_b, lse_b[:, :, :6])


# ---- sparse attention ----------------------------------------------------------------------------


def test_block_sparse_attention_equals_the_expanded_mask():
    b, s, n, d, block = 1, 300, 2, 64, 64
    q, k, v = randn(b, s, n, d), randn(b, s, n, d), randn(b, s, n, d)
    blocks = math.ceil(s / block)
    block_mask = torch.rand(b, n, blocks, blocks) > 0.5
    block_mask[..., 0] = True
    tokens = block_mask.repeat_interleave(block, -1).repeat_interleave(block, -2)[..., :s, :s]
    out = ditops.block_sparse_attention(q, k, v, block_mask, block)
    close(out, reference_attention(q, k, v, tokens)[0])


def test_rainfusion_dense_heads_are_dense_attention():
    frames, height, width = 3, 6, 8
    s = frames * height * width
    q, k, v = randn(1, s, 2, 32), randn(1, s, 2, 32), randn(1, s, 2, 32)
    out = ditops.rainfusion_attention(q, k, v, [frames, height, width],
                                      patterns=["dense", "dense"])
    close(out, reference_attention(q, k, v)[0])
    classified = ditops.rainfusion_attention(q, k, v, [frames, height, width], sparsity=0.5)
    assert classified.shape == q.shape and torch.isfinite(classified).all()


# ---- torch integration ---------------------------------------------------------------------------


def test_custom_ops_pass_opcheck():
    q, k, v = randn(1, 24, 2, 16), randn(1, 24, 2, 16), randn(1, 24, 2, 16)
    x, w = randn(2, 5, 48), randn(48)
    angles = torch.rand(24, 16)
    checks = [
        (torch.ops.ditops.attention_forward, (q, k, v, None, None, False, False, "automatic",
                                              2)),
        (torch.ops.ditops.attention_forward_lse, (q, k, v, None, None, True, False, "flash",
                                                  2)),
        (torch.ops.ditops.rms_norm, (x, w, 1e-6)),
        (torch.ops.ditops.add_rms_norm, (x, x, w, 1e-6)),
        (torch.ops.ditops.rotary_position_embedding, (q, angles.cos(), angles.sin(),
                                                      "rotated_half", False)),
        (torch.ops.ditops.rms_norm_rotary_position_embedding,
         (q, torch.rand(32), 1e-6, angles.cos(), angles.sin(), "rotated_interleaved", False)),
        (torch.ops.ditops.cfg_combine, (x, x, 2.0)),
        (torch.ops.ditops.merge_attention_states, (q, torch.randn(1, 2, 24), k,
                                                   torch.randn(1, 2, 24))),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_gradients_are_refused():
    with torch.enable_grad():
        q = randn(1, 8, 2, 16).requires_grad_()
        with pytest.raises(RuntimeError, match="forward-only"):
            ditops.attention_forward(q, q.detach(), q.detach())
        x = randn(2, 32).requires_grad_()
        with pytest.raises(RuntimeError, match="forward-only"):
            ditops.rms_norm(x, torch.ones(32))
        # Through the registered op, autograd refuses the backward pass.
        y = torch.ops.ditops.rms_norm(x, torch.ones(32), 1e-6)
        with pytest.raises(RuntimeError, match="forward-only"):
            y.sum().backward()


def test_compiled_function_agrees():
    def block(x, w, q, k, v, cos, sin):
        h = ditops.rms_norm(x, w)
        qr = ditops.rotary_position_embedding(q, cos, sin)
        return h, ditops.attention_forward(qr, k, v)

    args = (randn(2, 40, 64), randn(64), randn(2, 40, 2, 32), randn(2, 40, 2, 32),
            randn(2, 40, 2, 32), torch.rand(40, 32).cos(), torch.rand(40, 32).sin())
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    for got, want in zip(compiled(*args), block(*args)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_gil_is_released_while_a_kernel_runs():
    # Another Python thread records the time while the main thread is inside one C++ call: had
    # the call kept the GIL, no record could fall inside it.
    q = randn(1, 2048, 4, 64)
    out = torch.empty_like(q)
    stamps = []
    running = threading.Event()

    def record():
        running.wait()
        while running.is_set():
            stamps.append(time.perf_counter())

    recorder = threading.Thread(target=record)
    recorder.start()
    threads_before = ditops.num_threads()
    ditops.set_num_threads(1)  # a core left for the recorder
    running.set()
    start = time.perf_counter()
    ditops._ditops.attention_forward(q.numpy(), q.numpy(), q.numpy(), out.numpy(), None, None,
                                     None, False, False, "reference", 2)
    end = time.perf_counter()
    running.clear()
    recorder.join()
    ditops.set_num_threads(threads_before)
    margin = (end - start) / 4
    assert any(start + margin < t < end - margin for t in stamps)


def test_mla_decode_paged_matches_the_dequantized_cache():
    # Two sequences over a paged int8 cache (block size 64, scale groups of 128 values): the
    # result against softmax(scale · (q_nope·nope + q_rope·rope)) · nope in float64 on the
    # dequantized cache. The kernel quantizes q_nope to int8 per (sequence, head) and rounds the
    # P·V weights to u8 levels (docs/operators.md; 127 levels on AVX2). Measured on these
    # uniform int8 latents: 0.9 % relative L2 with AVX-512, 1.6 % with AVX2; bound 3e-2.
    blocks, block_size, heads, groups = 6, 64, 4, 4
    nope = torch.randint(-127, 128, (blocks, block_size, 512), dtype=torch.int8)
    nope_scale = torch.rand(blocks, block_size, groups) * 0.02 + 0.005
    rope = torch.randn(blocks, block_size, 64)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lengths = [150, 77]
    q_nope, q_rope = torch.randn(2, heads, 512), torch.randn(2, heads, 64)
    out = ditops.mla_decode_paged(q_nope, q_rope, nope, nope_scale, rope, table, lengths)
    values = nope.double() * nope_scale.double().repeat_interleave(512 // groups, dim=-1)
    scale = 1 / math.sqrt(576)
    for b, length in enumerate(lengths):
        tokens = torch.arange(length)
        rows = table[b, tokens // block_size].long(), tokens % block_size
        latent, rotary = values[rows], rope[rows].double()
        scores = scale * (q_nope[b].double() @ latent.T + q_rope[b].double() @ rotary.T)
        want = torch.softmax(scores, dim=-1) @ latent
        error = ((out[b].double() - want).norm() / want.norm()).item()
        assert error < 3e-2, error


# ---- argument types -----------------------------------------------------------------------------


def _typed_calls():
    """(function, valid keyword arguments, its tensor arguments, those that may be None) for
    every public call that takes tensors."""
    q, k = randn(1, 16, 2, 32), randn(1, 16, 2, 32)
    angles = torch.rand(16, 32)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    lse = torch.zeros(1, 2, 16)
    nope = torch.randint(-8, 8, (2, 64, 512), dtype=torch.int8)
    qkv = dict(query=q, key=k, value=k)
    return [
        (ditops.attention_forward, dict(qkv, attn_mask=None), list(qkv) + ["attn_mask"],
         {"attn_mask"}),
        (ditops.scaled_dot_product_attention, dict(qkv, attn_mask=None),
         list(qkv) + ["attn_mask"], {"attn_mask"}),
        (ditops.select_attention, dict(qkv, attn_mask=None), list(qkv) + ["attn_mask"],
         {"attn_mask"}),
        (ditops.attention_forward_varlen,
         dict(q=q[0], k=k[0], v=k[0], cu_seqlens_q=cu, cu_seqlens_k=cu),
         ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"], set()),
        (ditops.merge_attention_states,
         dict(out_a=q, lse_a=lse, out_b=k, lse_b=lse, out=None, lse=None),
         ["out_a", "lse_a", "out_b", "lse_b", "out", "lse"], {"out", "lse"}),
        (ditops.rotary_position_embedding, dict(x=q, cos=angles.cos(), sin=angles.sin()),
         ["x", "cos", "sin"], set()),
        (ditops.rms_norm, dict(x=q, weight=torch.ones(32)), ["x", "weight"], set()),
        (ditops.rms_norm_rotary_position_embedding,
         dict(x=q, weight=torch.ones(32), cos=angles.cos(), sin=angles.sin(), out=None),
         ["x", "weight", "cos", "sin", "out"], {"weight", "out"}),
        (ditops.add_rms_norm, dict(x=q, residual=k, weight=torch.ones(32)),
         ["x", "residual", "weight"], set()),
        (ditops.cfg_combine, dict(cond=q, uncond=k, scale=2.0, out=None), ["cond", "uncond", "out"],
         {"out"}),
        (ditops.block_sparse_attention,
         dict(q=q, k=k, v=k, block_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool), block_size=64),
         ["q", "k", "v", "block_mask"], set()),
        (ditops.rainfusion_attention, dict(q=q, k=k, v=k, latent_shape=[1, 4, 4]),
         ["q", "k", "v"], set()),
        (ditops.sparse_attention, dict(q=q, k=k, v=k, input_layout="BSND"), ["q", "k", "v"],
         set()),
        (ditops.mla_decode_paged,
         dict(q_nope=randn(1, 2, 512), q_rope=randn(1, 2, 64), nope=nope,
              nope_scale=torch.ones(2, 64, 1), rope=randn(2, 64, 64),
              block_table=torch.tensor([[0, 1]], dtype=torch.int32), seq_lens=[100]),
         ["q_nope", "q_rope", "nope", "nope_scale", "rope", "block_table", "seq_lens"], set()),
    ]


@pytest.mark.parametrize("function, kwargs, tensors, optional", _typed_calls(),
                         ids=lambda value: getattr(value, "__name__", ""))
def test_wrong_types_are_type_errors_naming_the_call_and_argument(function, kwargs, tensors,
                                                                  optional):
    function(**kwargs)  # the valid call runs
    for name in tensors:
        wrong_values = ["a string", {"a": 1}, 3.0, object()]
        if name not in optional:
            wrong_values.append(None)
        if name not in ("seq_lens", "cu_seqlens_q", "cu_seqlens_k"):  # lists are offsets there
            wrong_values.append([1.0, 2.0])
        for wrong in wrong_values:
            with pytest.raises(TypeError, match=rf"ditops\.{function.__name__}: {name} must be"):
                function(**{**kwargs, name: wrong})
