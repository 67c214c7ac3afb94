"""Shared by the Python tests: references in float64 computed by torch alone, and the
tolerances they are compared with."""

import math

import pytest
import torch

import ditops

torch.manual_seed(0)

# Tolerances against float64 references, for inputs of unit scale:
# - float32 kernels: fp32 sums of D (or S) products and an fp32 softmax; 1e-5 absolute plus a
#   few ulps relative covers them at the sizes here (D <= 128, S <= 300).
# - bfloat16 / float16 outputs add one rounding of the output (2^-8 / 2^-11 relative); the
#   flash_bf16 kernel also rounds P to bf16 before P·V (another 2^-8 relative on each weight,
#   which averages out over the keys): 2^-7 relative plus 2^-8 absolute.
TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2**-7, rtol=2**-7),
    torch.float16: dict(atol=2**-9, rtol=2**-9),
}


def close(actual, expected, dtype=None):
    dtype = dtype or actual.dtype
    torch.testing.assert_close(actual.double(), expected.double(), **TOLERANCE[dtype])


def reference_attention(q, k, v, mask=None, scale=None, causal=False, head_first=False):
    """softmax(scale · q·kᵀ + mask) · v and its natural-log log-sum-exp in float64, BSND (or
    BNSD); boolean masks True = attend; causal bottom-right aligned; GQA by repeating heads."""
    if not head_first:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = q.double(), k.double(), v.double()
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * q @ k.transpose(-1, -2)
    sq, sk = scores.shape[-2:]
    if mask is not None:
        scores = (scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool
                  else scores + mask.double())
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v
    return (out if head_first else out.transpose(1, 2)), lse


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = ditops.num_threads()
    ditops.set_num_threads(request.param)
    yield request.param
    ditops.set_num_threads(before)
