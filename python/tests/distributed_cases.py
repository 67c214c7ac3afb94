"""What each process of test_distributed.py runs (a module of its own, so that the processes
torch.multiprocessing spawns can import it). Every rank builds the same whole tensors from one
seed, passes its shard to ditops.distributed and compares its shard of the result with the
whole attention computed in fp64 by torch alone (and with ditops on one process)."""

import datetime
import math
import os
import time

import torch
import torch.distributed as dist


def finish():
    """Every rank done before any tears its connections down: a rank that destroys the group
    while its peer still has a call in flight can bring the peer's gloo threads down with it."""
    dist.barrier()
    dist.destroy_process_group()


def init(rank, world, store_path, timeout=60):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))


def reference(q, k, v, causal=False, joint=None, block_mask=None, block_size=64):
    """fp64 attention over the whole sequence with torch alone: (out BSND, lse [B, N, S])."""
    b, s, n, d = q.shape
    if joint is not None:
        k = torch.cat([joint[0], k], dim=1)
        v = torch.cat([joint[1], v], dim=1)
    group = n // k.shape[2]
    qh, kh, vh = (x.double().transpose(1, 2) for x in (q, k, v))
    kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    allowed = torch.ones(s, k.shape[1], dtype=torch.bool)
    text = k.shape[1] - s
    if causal:
        allowed[:, text:] = torch.ones(s, s, dtype=torch.bool).tril()
    allowed = allowed.expand(b, n, s, k.shape[1]).clone()
    if block_mask is not None:
        dense = block_mask.repeat_interleave(block_size, 2).repeat_interleave(block_size, 3)
        allowed[..., text:] &= dense[..., :s, :s].expand(b, n, s, s)
    scores = scores.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (weights @ vh).transpose(1, 2), lse


def shard(x, lengths, rank, dim=1):
    start = sum(lengths[:rank])
    return x.narrow(dim, start, lengths[rank])


def check_close(name, got, want, atol):
    error = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    assert error <= atol, f"{name}: max |error| {error:.3g} > {atol:.3g}"


def attention_cases(rank, world, store_path):
    """ring, ulysses and (on 4 ranks) hybrid against fp64 over layouts, splits and options."""
    init(rank, world, store_path)
    import ditops
    import ditops.distributed as dd

    strategies = {"ring": dd.ring_attention, "ulysses": dd.ulysses_attention}
    if world == 4:
        strategies["hybrid"] = lambda *a, **kw: dd.hybrid_attention(*a[:3], 2, *a[3:], **kw)
    even = [48 // world] * world
    uneven = [40, 8] if world == 2 else [5, 30, 1, 12]
    with_empty = [0, 48] if world == 2 else [16, 0, 20, 12]
    generator = torch.Generator().manual_seed(1)
    whole = {}
    for heads, kv_heads in ((4, 4), (4, 2), (8, 1)):
        whole[heads, kv_heads] = tuple(
            torch.randn(2, 48, h, 32, generator=generator) for h in (heads, kv_heads, kv_heads))
    text = tuple(torch.randn(2, 7, 4, 32, generator=generator) for _ in range(2))
    # fp32 flash against fp64: the scores of 32 products and the softmax sums in fp32 (about
    # 1e-6 relative), and one merge per shard (a few fp32 roundings): 2e-5 on outputs of |v| ~ 1.
    atol = 2e-5
    for name, attention in strategies.items():
        for lengths in (even, uneven, with_empty):
            if name != "ring" and 0 in lengths:
                continue  # an empty shard is only the ring's concern (no heads to exchange)
            for heads, kv_heads in ((4, 4), (4, 2), (8, 1)):
                q, k, v = whole[heads, kv_heads]
                for causal in (False, True):
                    want, want_lse = reference(q, k, v, causal)
                    out, lse = attention(*(shard(x, lengths, rank) for x in (q, k, v)),
                                         causal=causal, return_lse=True)
                    what = f"{name} {lengths} heads {heads}/{kv_heads} causal {causal}"
                    check_close(what, out, shard(want, lengths, rank), atol)
                    check_close(what + " lse", lse, shard(want_lse, lengths, rank, 2), atol)
        q, k, v = whole[4, 4]
        # BNSD, shards along dim 2.
        want, _ = reference(q, k, v, True)
        out = attention(*(shard(x.transpose(1, 2).contiguous(), uneven, rank, 2)
                          for x in (q, k, v)), causal=True, head_first=True)
        check_close(f"{name} head_first", out.transpose(1, 2), shard(want, uneven, rank), atol)
        # Text tokens every rank holds whole (joint attention with replicated text).
        want, _ = reference(q, k, v, joint=text)
        out = attention(*(shard(x, uneven, rank) for x in (q, k, v)), joint_key=text[0],
                        joint_value=text[1])
        check_close(f"{name} joint text", out, shard(want, uneven, rank), atol)
        # bf16: the ring merges in fp32 and rounds once, as one process does.
        single = ditops.attention_forward(*(x.bfloat16() for x in (q, k, v)))
        out = attention(*(shard(x, uneven, rank).bfloat16() for x in (q, k, v)))
        check_close(f"{name} bf16 vs one process", out, shard(single, uneven, rank), 2e-2)
    block_mask_cases(rank, world, strategies)
    merge_case()
    # A rank passing another attention's tensors: every rank raises, none waits.
    q, k, v = whole[4, 4] if rank != 1 else whole[8, 1]
    for name, attention in strategies.items():
        try:
            attention(*(shard(x, even, rank) for x in (q, k, v)))
        except ditops.Error as error:
            assert "every rank must pass shards of one attention" in str(error), str(error)
        else:
            raise AssertionError(f"{name} accepted ranks passing different heads")
    finish()


def block_mask_cases(rank, world, strategies):
    """A RainFusion-style block mask over the whole sequence, cut per rank."""
    import ditops

    generator = torch.Generator().manual_seed(2)
    blocks, block = 8, 64
    q, k, v = (torch.randn(1, blocks * block, 4, 32, generator=generator) for _ in range(3))
    mask = torch.rand(1, 4, blocks, blocks, generator=generator) < 0.4
    mask[..., torch.arange(blocks), torch.arange(blocks)] = True  # every row keeps a block
    lengths = [4 * block, 4 * block] if world == 2 else [block, 3 * block, 2 * block, 2 * block]
    want, _ = reference(q, k, v, block_mask=mask, block_size=block)
    single = ditops.block_sparse_attention(q, k, v, mask, block)
    check_close("block mask: one process vs fp64", single, want, 2e-5)
    for name, attention in strategies.items():
        out = attention(*(shard(x, lengths, rank) for x in (q, k, v)), block_mask=mask,
                        block_size=block)
        check_close(f"{name} block mask", out, shard(want, lengths, rank), 2e-5)
    bad = [block + 1, 8 * block - block - 1] if world == 2 else [block + 1, block - 1] + [3 * block] * 2
    try:
        strategies["ring"](*(shard(x, bad, rank) for x in (q, k, v)), block_mask=mask,
                           block_size=block)
    except ditops.Error as error:
        assert "multiple of block_size" in str(error), str(error)
    else:
        raise AssertionError("ring_attention accepted a shard not on a block boundary")


def merge_case():
    """merge_attention_states of two key halves, on torch tensors, against fp64."""
    import ditops

    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 9, 3, 16, generator=generator) for _ in range(3))
    a = ditops.attention_forward(q, k[:, :4], v[:, :4], return_lse=True)
    b = ditops.attention_forward(q, k[:, 4:], v[:, 4:], return_lse=True)
    out, lse = ditops.merge_attention_states(a[0], a[1], b[0], b[1])
    want, want_lse = reference(q, k, v)
    check_close("merge", out, want, 2e-5)
    check_close("merge lse", lse, want_lse, 2e-5)


def diffusers_case(rank, world, store_path, model_name, ring, ulysses):
    """A diffusers transformer (small random config) on ditops, sequence-parallel through
    diffusers' own context-parallel configuration, against the same model on one process."""
    init(rank, world, store_path)
    import ditops.diffusers

    import models

    model, inputs = getattr(models, model_name)()
    if model_name == "wan":
        # One timestep per token (as Wan 2.2 takes it): diffusers' plan splits a [B, S]
        # timestep, and its warning for a [B] one fails without transformers installed.
        _, _, frames, height, width = inputs["hidden_states"].shape
        inputs["timestep"] = inputs["timestep"].expand(1, frames * height * width // 4)
    import ditops.distributed

    calls = []
    original = ditops.distributed._context_parallel
    ditops.distributed._context_parallel = lambda *a: calls.append(a) or original(*a)
    with torch.no_grad():
        ditops.diffusers.enable(model)
        single = model(**inputs)[0]
        assert not calls
        ditops.diffusers.enable_parallelism(model, ring_degree=ring, ulysses_degree=ulysses)
        parallel = model(**inputs)[0]
    assert calls, "the model's attention did not run on ditops.distributed"
    error = (parallel - single).abs().max().item()
    scale = single.abs().max().item()
    assert error <= 1e-4 * scale, f"{model_name} ring {ring} ulysses {ulysses}: {error:.3g}"
    finish()


def failure_case(rank, world, store_path, mode, result_path):
    """Rank 1 dies or stops answering in the middle of a call; rank 0 must raise within the
    timeout, naming the call. Rank 0 writes what it saw to result_path."""
    init(rank, world, store_path, timeout=120)
    import ditops.distributed as dd

    dd.set_timeout(3)
    q = torch.randn(1, 64, 2, 16)
    call = dd.ring_attention if mode.startswith("ring") else dd.ulysses_attention
    call(q, q, q)  # every rank is up and connected
    if rank == 1:
        dd._shard_lengths(q, q, q, dist.group.WORLD, "test")  # takes part in the first exchange
        if mode.endswith("dead"):
            os._exit(0)
        time.sleep(6)  # longer than the timeout
        os._exit(0)
    start = time.monotonic()
    try:
        call(q, q, q)
        seen = "no error"
    except RuntimeError as error:
        seen = f"{time.monotonic() - start:.1f}\n{error}"
    with open(result_path, "w") as f:
        f.write(seen)
    os._exit(0)
