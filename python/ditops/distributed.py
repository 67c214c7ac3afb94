"""Context-parallel attention over torch.distributed: one attention's sequence split across
processes (and machines), each rank holding a contiguous shard of the tokens.

- ring_attention: key/value shards travel around the ring of ranks (send/recv overlapped with
  the attention on the shard at hand); each rank merges its partial results by log-sum-exp.
- ulysses_attention: an all-to-all turns the sequence-sharded q/k/v into head-sharded ones over
  the whole sequence, each rank runs one attention on its heads, a second all-to-all turns the
  output back.
- hybrid_attention: Ulysses inside groups of `ulysses_degree` consecutive ranks, ring across the
  groups.

Each returns the rank's shard of the output, equal to the matching rows of one attention over
the whole sequence (`causal` counts global positions). Every wait is bounded: a rank that dies or
stops answering makes the others raise RuntimeError naming the peer, within the timeout
(set_timeout, default 300 s). See docs/distributed.md."""

import datetime
import math

import torch
import torch.distributed as dist

from . import ops
from ._ditops import Error

_timeout = datetime.timedelta(seconds=300)


def set_timeout(seconds):
    """The longest any ditops.distributed call waits for a peer (default 300 s)."""
    global _timeout
    if not seconds > 0:
        raise Error(f"ditops.distributed.set_timeout: seconds ({seconds}) must be > 0")
    _timeout = datetime.timedelta(seconds=float(seconds))


# ---- waiting on peers ----------------------------------------------------------------------------


def _wait(works, call, what):
    """Waits for every torch.distributed Work in `works` within the timeout; a peer that died or
    timed out becomes a RuntimeError saying which call waited for what."""
    try:
        for work in works:
            if not work.wait(_timeout):
                raise RuntimeError("timed out")
    except RuntimeError as error:
        raise RuntimeError(
            f"ditops.distributed.{call}: rank {dist.get_rank()} waited for {what} and got "
            f"nothing within {_timeout.total_seconds():g} s: a peer process died or is stuck "
            f"({error})") from error


_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _shard_lengths(q, k, v, group, call):
    """Every rank's shard length, in the group's rank order (one small all-gather), after
    checking that every rank passes the same batch, heads, head sizes and dtype: a rank whose
    tensors disagree makes every rank raise, before any shard is exchanged."""
    size = dist.get_world_size(group)
    dtype = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    mine = torch.tensor([q.shape[1], q.shape[0], q.shape[2], k.shape[2], q.shape[3],
                         v.shape[3], dtype], dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(size)]
    _wait([dist.all_gather(everyone, mine, group=group, async_op=True)], call,
          "the other ranks' shard lengths")
    for rank, theirs in enumerate(everyone):
        if not torch.equal(theirs[1:], everyone[0][1:]):
            raise Error(
                f"ditops.distributed.{call}: rank {rank} of the group passes batch, heads, key "
                f"heads, head sizes and dtype {theirs[1:].tolist()} where rank 0 passes "
                f"{everyone[0][1:].tolist()}: every rank must pass shards of one attention")
    return [int(t[0]) for t in everyone]


def _group_size(group):
    return 1 if group is None else dist.get_world_size(group)


# ---- arguments -----------------------------------------------------------------------------------


class _Problem:
    """The arguments every strategy shares, as BSND views (a BNSD input is viewed transposed;
    outputs come back in the input's layout)."""

    def __init__(self, call, query, key, value, causal, head_first, scale, joint_key,
                 joint_value, block_mask, block_size):
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
                raise Error(f"ditops.distributed.{call}: {name} must be a rank-4 torch tensor "
                            "([B, S, N, D], or [B, N, S, D] with head_first)")
        def bsnd(x):
            return None if x is None else (x.transpose(1, 2) if head_first else x)

        self.call = call
        self.head_first = head_first
        self.query, self.key, self.value = bsnd(query), bsnd(key), bsnd(value)
        self.causal = bool(causal)
        self.scale = scale
        self.joint_key, self.joint_value = bsnd(joint_key), bsnd(joint_value)
        if (joint_key is None) != (joint_value is None):
            raise Error(f"ditops.distributed.{call}: joint_key and joint_value go together")
        if joint_key is not None and self.causal:
            raise Error(f"ditops.distributed.{call}: joint (replicated text) tokens are not "
                        "causal: pass causal=False")
        self.block_mask = block_mask
        self.block_size = int(block_size)
        if block_mask is not None and self.causal:
            raise Error(f"ditops.distributed.{call}: block_mask is not causal: pass "
                        "causal=False")
        q, k, v = self.query, self.key, self.value
        if not (q.dtype == k.dtype == v.dtype and q.shape[0] == k.shape[0] == v.shape[0]
                and k.shape[1:3] == v.shape[1:3] and q.shape[3] == k.shape[3]
                and k.shape[2] > 0 and q.shape[2] % k.shape[2] == 0):
            raise Error(f"ditops.distributed.{call}: query {list(q.shape)}, key "
                        f"{list(k.shape)} and value {list(v.shape)} ({q.dtype}, {k.dtype}, "
                        f"{v.dtype}) are not one attention's: one dtype, one batch, key and "
                        "value of one length and heads, the query's heads a multiple of the "
                        "key's, query and key of one head size")
        if self.key.shape[1] != self.query.shape[1]:
            raise Error(f"ditops.distributed.{call}: each rank's key shard "
                        f"({self.key.shape[1]} tokens) must match its query shard "
                        f"({self.query.shape[1]}): context parallelism splits one sequence")

    def output(self, out):
        return out.transpose(1, 2) if self.head_first else out


# ---- ring ------------------------------------------------------------------------------------------


def _attend(p, q, k, v, causal, mask_rows, mask_cols, lse_dtype=torch.float32):
    """(out, lse) of q over one key block: block-sparse when a block mask is given (its rows and
    columns for this block), dense otherwise."""
    if p.block_mask is None:
        return ops.attention_forward(q, k, v, scale=p.scale, causal=causal, return_lse=True)
    mask = p.block_mask[:, :, mask_rows, mask_cols].contiguous()
    return ops.block_sparse_attention(q, k, v, mask, p.block_size, scale=p.scale,
                                      return_lse=True)


def _block_range(p, start, length, what):
    """The block-mask indices covering tokens [start, start + length)."""
    if start % p.block_size:
        raise Error(f"ditops.distributed.{p.call}: with a block_mask every shard must start at a "
                    f"multiple of block_size ({p.block_size}); {what} starts at token {start}")
    return slice(start // p.block_size, -(-(start + length) // p.block_size))


class _Accumulator:
    """The running (out, lse) of a query shard, merged block by block in fp32."""

    def __init__(self):
        self.out = self.lse = None

    def add(self, out, lse):
        if self.out is None:
            self.out = out if out.dtype == torch.float32 else out.float()
            self.lse = lse
        else:
            ops.merge_attention_states(self.out, self.lse, out, lse, out=self.out, lse=self.lse)


def _ring(p, q, k, v, group):
    """q's rows attended over the key/value shards of every rank of `group`, the shards passing
    around the ring while the shard at hand is attended. q, k, v: BSND, this rank's (after any
    Ulysses exchange)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = _shard_lengths(q, k, v, group, p.call)
    starts = [sum(lengths[:r]) for r in range(size)]
    ranges = None
    if p.block_mask is not None:  # every rank checks every shard: all refuse, or none does
        ranges = [_block_range(p, starts[r], lengths[r], f"rank {r}'s shard") for r in range(size)]
    acc = _Accumulator()
    if p.joint_key is not None:
        acc.add(*ops.attention_forward(q, p.joint_key, p.joint_value, scale=p.scale,
                                       return_lse=True))
    k, v = k.contiguous(), v.contiguous()
    for step in range(size):
        owner = (rank - step) % size  # whose shard k, v are
        works = []
        if step + 1 < size:
            coming = (rank - step - 1) % size
            next_k = k.new_empty((k.shape[0], lengths[coming]) + tuple(k.shape[2:]))
            next_v = v.new_empty((v.shape[0], lengths[coming]) + tuple(v.shape[2:]))
            after, before = (rank + 1) % size, (rank - 1) % size
            works = [dist.isend(k, group=group, group_dst=after, tag=0),
                     dist.isend(v, group=group, group_dst=after, tag=1),
                     dist.irecv(next_k, group=group, group_src=before, tag=0),
                     dist.irecv(next_v, group=group, group_src=before, tag=1)]
        # Causal over global positions: earlier shards whole, this rank's own causally, later
        # shards not at all.
        if not (p.causal and owner > rank) and lengths[owner] > 0 and q.shape[1] > 0:
            rows, cols = (ranges[rank], ranges[owner]) if ranges else (None, None)
            acc.add(*_attend(p, q, k, v, p.causal and owner == rank, rows, cols))
        if works:
            _wait(works, p.call, f"rank {coming}'s key/value shard from rank {before} of the "
                  "ring")
            k, v = next_k, next_v
    if acc.out is None:  # nothing visible: an empty shard
        out = q.new_zeros(tuple(q.shape[:3]) + (v.shape[3],), dtype=torch.float32)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), -math.inf)
        return out, lse
    return acc.out, acc.lse


# ---- Ulysses ---------------------------------------------------------------------------------------


def _sequence_to_heads(x, group, lengths, call, what):
    """This rank's shard [B, S_r, H, D] of x as all S tokens of its H / U heads [B, S, H/U, D]
    (one all-to-all over the group of U ranks)."""
    size = len(lengths)
    b, s, h, d = x.shape
    if h % size:
        raise Error(f"ditops.distributed.{call}: {what} has {h} heads, not a multiple of the "
                    f"Ulysses degree {size}")
    part = h // size
    send = x.reshape(b, s, size, part, d).permute(2, 0, 1, 3, 4).contiguous()
    receive = x.new_empty(b * sum(lengths) * part * d)
    sizes = [b * n * part * d for n in lengths]
    _wait([dist.all_to_all_single(receive, send.reshape(-1), sizes, [b * s * part * d] * size,
                                  group=group, async_op=True)], call,
          f"the {what} exchange of the Ulysses group")
    pieces = [piece.view(b, n, part, d) for piece, n in zip(receive.split(sizes), lengths)]
    return torch.cat(pieces, dim=1)


def _heads_to_sequence(y, group, lengths, rank, call, what):
    """The inverse: [B, S, H/U, D] of this rank's heads back to its shard [B, S_r, H, D]."""
    size = len(lengths)
    b, _, part, d = y.shape
    send = torch.cat([piece.reshape(-1) for piece in y.split(lengths, dim=1)])
    mine = lengths[rank]
    receive = y.new_empty(size * b * mine * part * d)
    _wait([dist.all_to_all_single(receive, send, [b * mine * part * d] * size,
                                  [b * n * part * d for n in lengths], group=group,
                                  async_op=True)], call,
          f"the {what} exchange of the Ulysses group")
    return receive.view(size, b, mine, part, d).permute(1, 2, 0, 3, 4).reshape(b, mine,
                                                                                 size * part, d)


def _lse_to_sequence(lse, group, lengths, rank, call):
    """[B, H/U, S] lse of this rank's heads back to [B, H, S_r] of its shard."""
    shard = _heads_to_sequence(lse.transpose(1, 2).unsqueeze(-1), group, lengths, rank, call,
                               "lse")
    return shard.squeeze(-1).transpose(1, 2).contiguous()


# ---- the strategies ------------------------------------------------------------------------------


def _context_parallel(p, ring_group, ulysses_group, return_lse, whole_group=None):
    """Ulysses over `ulysses_group` (if it has more than one rank), then ring over `ring_group`
    (likewise) or one local attention, then Ulysses back. With both, `whole_group` (default:
    the world) holds every rank of both: all of them check their arguments agree first, so
    that a disagreement makes them all raise."""
    for group in (ring_group, ulysses_group):
        if group is not None and dist.get_rank(group) < 0:
            raise Error(f"ditops.distributed.{p.call}: rank {dist.get_rank()} is not a member of "
                        "the group it was given")
    q, k, v = p.query, p.key, p.value
    ulysses = _group_size(ulysses_group) > 1
    if ulysses and _group_size(ring_group) > 1:
        _shard_lengths(q, k, v, whole_group or dist.group.WORLD, p.call)
    if ulysses:
        rank = dist.get_rank(ulysses_group)
        lengths = _shard_lengths(q, k, v, ulysses_group, p.call)
        size = len(lengths)
        if k.shape[2] % size and size % k.shape[2] == 0:
            # Fewer key heads than ranks (GQA): each rank gets a copy of its query heads' one.
            k = k.repeat_interleave(size // k.shape[2], dim=2)
            v = v.repeat_interleave(size // v.shape[2], dim=2)
            if p.joint_key is not None:
                p.joint_key = p.joint_key.repeat_interleave(size // p.joint_key.shape[2], dim=2)
                p.joint_value = p.joint_value.repeat_interleave(size // p.joint_value.shape[2],
                                                                dim=2)
        q = _sequence_to_heads(q, ulysses_group, lengths, p.call, "query")
        k = _sequence_to_heads(k, ulysses_group, lengths, p.call, "key")
        v = _sequence_to_heads(v, ulysses_group, lengths, p.call, "value")
        # This rank's heads of everything else that has heads.
        if p.joint_key is not None:
            group_heads = slice(rank * k.shape[2], (rank + 1) * k.shape[2])
            p.joint_key = p.joint_key[:, :, group_heads]
            p.joint_value = p.joint_value[:, :, group_heads]
        if p.block_mask is not None and p.block_mask.shape[1] > 1:
            p.block_mask = p.block_mask[:, rank * q.shape[2]:(rank + 1) * q.shape[2]]
    if _group_size(ring_group) > 1:
        out, lse = _ring(p, q, k, v, ring_group)
    else:
        acc = _Accumulator()
        if p.joint_key is not None:
            acc.add(*ops.attention_forward(q, p.joint_key, p.joint_value, scale=p.scale,
                                           return_lse=True))
        whole = slice(None)
        acc.add(*_attend(p, q, k, v, p.causal, whole, whole))
        out, lse = acc.out, acc.lse
    out = out.to(p.query.dtype)
    if ulysses:
        out = _heads_to_sequence(out, ulysses_group, lengths, rank, p.call, "output")
        if return_lse:
            lse = _lse_to_sequence(lse, ulysses_group, lengths, rank, p.call)
    out = p.output(out)
    return (out, lse) if return_lse else out


_ARGUMENTS = """Every rank of `group` (default: the world) passes its own contiguous shard of
    the sequence (BSND: dim 1, or dim 2 with head_first; rank r of the group holds the r-th
    shard; shards may differ in length, and q, k, v of a rank have the same length). Returns
    the rank's shard of the output (and of the lse, float32 [B, N, S_r], with return_lse),
    equal to those rows of one attention over the whole sequence. causal: over global
    positions. scale: default 1/sqrt(D). joint_key / joint_value: tokens every rank holds whole
    (text replicated on each rank), attended by every query besides the sequence (not with
    causal). block_mask, block_size: a block-sparse mask over the whole sequence (bool
    [B|1, N|1, ceil(S / block_size), ceil(S / block_size)], e.g. RainFusion's), each rank
    cutting its rows and each shard's columns (every shard must then start at a multiple of
    block_size)."""


def ring_attention(query, key, value, group=None, causal=False, head_first=False,
                   return_lse=False, *, scale=None, joint_key=None, joint_value=None,
                   block_mask=None, block_size=128):
    p = _Problem("ring_attention", query, key, value, causal, head_first, scale, joint_key,
                 joint_value, block_mask, block_size)
    return _context_parallel(p, group or dist.group.WORLD, None, return_lse)


def ulysses_attention(query, key, value, group=None, causal=False, head_first=False,
                      return_lse=False, *, scale=None, joint_key=None, joint_value=None,
                      block_mask=None, block_size=128):
    p = _Problem("ulysses_attention", query, key, value, causal, head_first, scale, joint_key,
                 joint_value, block_mask, block_size)
    return _context_parallel(p, None, group or dist.group.WORLD, return_lse)


_hybrid_groups = {}


def hybrid_groups(ulysses_degree, group=None):
    """(ring_group, ulysses_group) of this rank when `group` (default: the world) is split into
    Ulysses groups of `ulysses_degree` consecutive ranks and rings across them (rank r is ring
    member r // ulysses_degree). Collective the first time (every rank of the world must call
    it); cached after."""
    group = group or dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(group))
    degree = int(ulysses_degree)
    if degree < 1 or len(ranks) % degree:
        raise Error(f"ditops.distributed.hybrid_groups: ulysses_degree ({ulysses_degree}) must "
                    f"divide the group's {len(ranks)} ranks")
    key = (ranks, degree)
    if key not in _hybrid_groups:
        me = dist.get_rank()
        mine = [None, None]
        rings = len(ranks) // degree
        for u in range(rings):  # every rank creates every group, in the same order
            members = list(ranks[u * degree:(u + 1) * degree])
            created = dist.new_group(members)
            if me in members:
                mine[1] = created
        for i in range(degree):
            members = list(ranks[i::degree])
            created = dist.new_group(members)
            if me in members:
                mine[0] = created
        _hybrid_groups[key] = tuple(mine)
    return _hybrid_groups[key]


def hybrid_attention(query, key, value, ulysses_degree, group=None, causal=False,
                     head_first=False, return_lse=False, *, scale=None, joint_key=None,
                     joint_value=None, block_mask=None, block_size=128):
    ring_group, ulysses_group = hybrid_groups(ulysses_degree, group)
    p = _Problem("hybrid_attention", query, key, value, causal, head_first, scale, joint_key,
                 joint_value, block_mask, block_size)
    return _context_parallel(p, ring_group, ulysses_group, return_lse, group)


def context_parallel_attention(query, key, value, ring_group=None, ulysses_group=None,
                               causal=False, head_first=False, return_lse=False, *, scale=None,
                               joint_key=None, joint_value=None, block_mask=None,
                               block_size=128, group=None):
    """Ulysses over `ulysses_group`, ring over `ring_group` (either may be None: not used),
    with groups the caller made (a device mesh's, say); the sequence shards are in ring-major
    order (ring member i holds the i-th run of Ulysses groups' shards). `group` (default: the
    world) holds every rank of both groups."""
    p = _Problem("context_parallel_attention", query, key, value, causal, head_first, scale,
                 joint_key, joint_value, block_mask, block_size)
    return _context_parallel(p, ring_group, ulysses_group, return_lse, group)


ring_attention.__doc__ = ("Ring attention: key/value shards pass around the ranks, overlapped "
                          "with the attention on the shard at hand. " + _ARGUMENTS)
ulysses_attention.__doc__ = ("Ulysses attention: all-to-all from sequence shards to head shards "
                             "and back; the heads (and key heads) must divide by the group "
                             "size. " + _ARGUMENTS)
hybrid_attention.__doc__ = ("Ulysses within groups of `ulysses_degree` consecutive ranks, ring "
                            "across the groups. " + _ARGUMENTS)

__all__ = ["ring_attention", "ulysses_attention", "hybrid_attention", "hybrid_groups",
           "context_parallel_attention", "set_timeout"]
