"""ditops.mindiesd's sparse_attention (and rf_v3's bsa_sparse_attention_v3) against MindIE-SD
3.1.0's documented rf_v2 rule, written here from its definition and computed in float64: the
token order (8 x 8 spatial tiles, text after the video), the pooled block scores, the top-K
count, the forced text and first-frame blocks, then attention over exactly the kept blocks.
Also sparsity 0 (dense), sparse_type None (dense, attn_mask and is_causal ignored), both
layouts, bf16, video_spans, batch entries, and bad inputs."""

import math

import pytest
import torch

from conftest import close, reference_attention
from ditops.mindiesd import sparse_attention
from ditops.mindiesd._unsupported import FeatureNotSupported
from ditops.mindiesd.layers.flash_attn import sparse_flash_attn_ada_bsa as ada_bsa
from ditops.rainfusion_v2 import rainfusion_v2_attention
from ditops.mindiesd.layers.flash_attn.sparse_flash_attn_rf_v3 import bsa_sparse_attention_v3
from ditops.mindiesd.utils.exception import ParametersInvalid

# ---- the rule, from its definition -----------------------------------------------------------


def video_order(frames, height, width):
    """Video tokens ((t, h, w) raster indices) in rf_v2's order: per frame the 8 x 8 tiles of the
    largest multiple-of-8 rectangle (tile rows, then tiles, then tokens row-major inside a tile),
    then the rows below it, then the columns right of it; the first frame in raster order when
    height or width is not a multiple of 8."""
    aligned = height % 8 == 0 and width % 8 == 0
    tiled_h, tiled_w = height // 8 * 8, width // 8 * 8
    keys = []
    for t in range(frames):
        for h in range(height):
            for w in range(width):
                if t == 0 and not aligned:
                    keys.append((t, 0, h, w, 0, 0))
                elif h < tiled_h and w < tiled_w:
                    keys.append((t, 0, h // 8, w // 8, h % 8, w % 8))
                elif h >= tiled_h:
                    keys.append((t, 1, h, w, 0, 0))
                else:
                    keys.append((t, 2, h, w, 0, 0))
    return sorted(range(len(keys)), key=keys.__getitem__)


def layout_order(shape, text, text_first=True):
    """(input row of each rf_v2 position, forced blocks as a function of the block size)."""
    video = video_order(*shape)
    n_video = len(video)
    if text_first:
        order = [text + i for i in video] + list(range(text))
    else:
        order = video + [n_video + i for i in range(text)]

    def forced(block, first_frame=True):
        blocks = math.ceil(len(order) / block)
        keep = set(range(blocks - math.ceil(text / block), blocks))
        if first_frame:
            keep |= set(range(math.ceil(shape[1] * shape[2] / block)))
        return keep

    return order, forced


def spans_order(seq_len, spans, block):
    """video_spans: each video in rf_v2's order starting on a fresh block; context (non-video)
    rows, in order, fill a video's last block unless it is the last video, the rest go last.
    Forced: each video's first-frame blocks, the filled blocks and the trailing context's."""
    video_rows = set()
    for start, shape in spans:
        video_rows |= set(range(start, start + math.prod(shape)))
    context = [i for i in range(seq_len) if i not in video_rows]
    order, forced = [], set()
    for index, (start, shape) in enumerate(spans):
        first = len(order) // block
        forced |= set(range(first, first + math.ceil(shape[1] * shape[2] / block)))
        order += [start + i for i in video_order(*shape)]
        if index + 1 < len(spans) and len(order) % block:
            forced.add(len(order) // block)
            while len(order) % block:
                order.append(context.pop(0))
    forced |= set(range(len(order) // block, math.ceil(seq_len / block)))
    return order + context, forced


def block_choice(q, k, order, block, sparsity, scale, forced):
    """rf_v2's block mask in float64, bool [B, N, blocks, blocks]; q, k BNSD."""
    q, k = q.double()[:, :, order], k.double()[:, :, order]
    blocks = math.ceil(q.shape[2] / block)
    pooled_q = torch.stack([q[:, :, i * block:(i + 1) * block].mean(2) for i in range(blocks)], 2)
    pooled_k = torch.stack([k[:, :, i * block:(i + 1) * block].mean(2) for i in range(blocks)], 2)
    scores = torch.softmax(scale * pooled_q @ pooled_k.transpose(-1, -2), dim=-1)
    count = max(1, math.ceil(blocks * (1 - sparsity)))
    ranked = scores.sort(dim=-1, descending=True).values
    # A near-tie between the count-th and the next score would make the float32 choice and this
    # one legitimately differ: the inputs must not have one.
    if count < blocks:
        gap = (ranked[..., count - 1] - ranked[..., count]).abs() / ranked[..., 0]
        assert gap.min() > 1e-5, "ambiguous test input: pick another seed"
    mask = scores >= ranked[..., count - 1:count]
    forced = sorted(forced)
    mask[:, :, forced, :] = True
    mask[:, :, :, forced] = True
    return mask


def token_mask(block_mask, order, block):
    """The block mask (rf_v2 positions) as a token mask in input order."""
    position = torch.empty(len(order), dtype=torch.long)
    position[torch.tensor(order)] = torch.arange(len(order))
    rows = position // block
    return block_mask[:, :, rows][:, :, :, rows]


def to_bnsd(x, layout):
    return x if layout == "BNSD" else x.transpose(1, 2)


def reference(q, k, v, block_mask, order, block, layout, scale=None):
    mask = token_mask(block_mask, order, block)
    return reference_attention(q, k, v, mask, scale=scale, head_first=layout == "BNSD")[0]


def inputs(shape, layout, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    b, n, s, d = shape
    full = (b, n, s, d) if layout == "BNSD" else (b, s, n, d)
    return [torch.randn(full, generator=generator).to(dtype) for _ in range(3)]


def assert_sparse_matters(out, q, k, v, layout):
    """The kept blocks change the result: a test that the rule passes could also fail."""
    dense = reference_attention(q, k, v, head_first=layout == "BNSD")[0]
    assert (out.double() - dense).abs().max() > 1e-3


# ---- rf_v2 -------------------------------------------------------------------------------------

# (latent shape, text tokens, block size): aligned, unaligned height and width (the first frame
# in raster order, remainder rows and columns), one with more text than a block, and one beyond
# MindIE-SD's reach (height < 8; MindIE-SD's tensor split fails there, the rule still applies).
LAYOUTS = [((4, 8, 16), 0, 64), ((4, 10, 12), 40, 64), ((4, 9, 20), 70, 64),
           ((4, 16, 16), 0, 128), ((3, 6, 20), 0, 64)]


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("shape,text,block", LAYOUTS, ids=str)
def test_rf_v2_keeps_the_blocks_of_its_rule(layout, shape, text, block):
    seq_len = text + math.prod(shape)
    q, k, v = inputs((1, 2, seq_len, 32), layout, seed=seq_len)
    order, forced = layout_order(shape, text)
    out = sparse_attention(q, k, v, input_layout=layout, sparse_type="rf_v2", txt_len=text,
                           block_size=block, latent_shape_q=list(shape), sparsity=0.5)
    mask = block_choice(to_bnsd(q, layout), to_bnsd(k, layout), order, block, 0.5, 32 ** -0.5,
                        forced(block))
    assert not mask.all()
    close(out, reference(q, k, v, mask, order, block, layout))
    assert_sparse_matters(out, q, k, v, layout)


def test_rf_v2_sparsity_scale_and_the_ends_of_the_range():
    shape, text, block = (4, 10, 12), 40, 64
    seq_len = text + math.prod(shape)
    q, k, v = inputs((1, 2, seq_len, 32), "BNSD", seed=7)
    order, forced = layout_order(shape, text)
    common = dict(sparse_type="rf_v2", txt_len=text, latent_shape_q=list(shape), block_size=block)
    # sparsity 0 keeps every block: dense attention.
    close(sparse_attention(q, k, v, sparsity=0.0, **common), reference_attention(
        q, k, v, head_first=True)[0])
    # 0.75 and 1 (one key block per row besides the forced ones), with a given scale.
    for sparsity in (0.75, 1.0):
        out = sparse_attention(q, k, v, scale=0.3, sparsity=sparsity, **common)
        mask = block_choice(q, k, order, block, sparsity, 0.3, forced(block))
        close(out, reference(q, k, v, mask, order, block, "BNSD", scale=0.3))


def test_rf_v2_uses_batch_entry_0s_choice_and_rf_v3_each_ones_own():
    shape, block = (4, 8, 16), 64
    seq_len = math.prod(shape)
    q, k, v = inputs((2, 2, seq_len, 32), "BSND", seed=3)
    order, forced = layout_order(shape, 0)
    masks = [block_choice(to_bnsd(q[i:i + 1], "BSND"), to_bnsd(k[i:i + 1], "BSND"), order,
                          block, 0.5, 32 ** -0.5, forced(block)) for i in range(2)]
    assert not torch.equal(masks[0], masks[1])  # the two policies differ on these inputs
    common = dict(input_layout="BSND", latent_shape_q=list(shape), block_size=block,
                  sparsity=0.5)
    v2 = sparse_attention(q, k, v, sparse_type="rf_v2", **common)
    v3 = sparse_attention(q, k, v, sparse_type="rf_v3", **common)
    for i in range(2):
        entry = (q[i:i + 1], k[i:i + 1], v[i:i + 1])
        close(v2[i:i + 1], reference(*entry, masks[0], order, block, "BSND"))
        close(v3[i:i + 1], reference(*entry, masks[i], order, block, "BSND"))


def test_rf_v2_bf16():
    shape, text, block = (4, 10, 12), 40, 64
    seq_len = text + math.prod(shape)
    q, k, v = inputs((1, 2, seq_len, 64), "BSND", seed=11, dtype=torch.bfloat16)
    order, forced = layout_order(shape, text)
    out = sparse_attention(q, k, v, input_layout="BSND", sparse_type="rf_v2", txt_len=text,
                           latent_shape_q=list(shape), block_size=block, sparsity=0.6)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    mask = block_choice(to_bnsd(q, "BSND"), to_bnsd(k, "BSND"), order, block, 0.6, 64 ** -0.5,
                        forced(block))
    close(out, reference(q, k, v, mask, order, block, "BSND"))


@pytest.mark.parametrize("sparse_type", ["rf_v2", "rf_v3"])
def test_video_spans(sparse_type):
    # text, a reference clip, an image, the target clip, trailing text.
    spans = [{"start": 30, "latent_shape": [2, 8, 10]},
             {"start": 260, "latent_shape": [3, 9, 8]}]
    seq_len, block = 260 + 216 + 50, 64
    q, k, v = inputs((1, 2, seq_len, 32), "BNSD", seed=5)
    order, forced = spans_order(seq_len, [(s["start"], s["latent_shape"]) for s in spans], block)
    assert sorted(order) == list(range(seq_len))
    out = sparse_attention(q, k, v, sparse_type=sparse_type, video_spans=spans, block_size=block,
                           sparsity=0.6)
    mask = block_choice(q, k, order, block, 0.6, 32 ** -0.5, forced)
    close(out, reference(q, k, v, mask, order, block, "BNSD"))
    assert_sparse_matters(out, q, k, v, "BNSD")
    # Two clips and no context rows to finish the first one's last block.
    packed = [{"start": 0, "latent_shape": [1, 8, 9]}, {"start": 72, "latent_shape": [1, 8, 8]}]
    q, k, v = inputs((1, 1, 136, 32), "BNSD", seed=6)
    with pytest.raises(ParametersInvalid, match="too few"):
        sparse_attention(q, k, v, sparse_type=sparse_type, video_spans=packed, block_size=block)


def test_text_after_the_video_and_an_unforced_first_frame():
    """ditops' diffusers backend: the text on either side, keep_sink as the first-frame choice,
    each batch entry's own blocks."""
    shape, text, block = (4, 10, 12), 40, 64
    seq_len = text + math.prod(shape)
    q, k, v = inputs((2, 2, seq_len, 32), "BSND", seed=13)
    order, forced = layout_order(shape, text, text_first=False)
    for first_frame in (True, False):
        out = rainfusion_v2_attention(q, k, v, list(shape), text, False, 0.5, block,
                                      protect_first_frame=first_frame)
        for i in range(2):
            entry = (q[i:i + 1], k[i:i + 1], v[i:i + 1])
            mask = block_choice(to_bnsd(entry[0], "BSND"), to_bnsd(entry[1], "BSND"), order,
                                block, 0.5, 32 ** -0.5, forced(block, first_frame))
            close(out[i:i + 1], reference(*entry, mask, order, block, "BSND"))


# ---- rf_v3's entry point ---------------------------------------------------------------------


def test_bsa_sparse_attention_v3_returns_and_reuses_its_mask():
    shape, text, block = (4, 10, 12), 40, 64
    seq_len = text + math.prod(shape)
    q, k, v = inputs((2, 2, seq_len, 32), "BNSD", seed=17)
    order, forced = layout_order(shape, text)
    for first_frame in (True, False):
        out, mask = bsa_sparse_attention_v3(q, k, v, list(shape), txt_len=text, sparsity=0.5,
                                            input_layout="BNSD", block_size=block,
                                            protect_first_frame=first_frame)
        want = block_choice(q, k, order, block, 0.5, 32 ** -0.5, forced(block, first_frame))
        assert mask.dtype == torch.int8 and torch.equal(mask.bool(), want)
        close(out, reference(q, k, v, want, order, block, "BNSD"))
    # A cached mask is used as it is, whatever the new inputs score.
    q2, k2, v2 = inputs((2, 2, seq_len, 32), "BNSD", seed=18)
    again, returned = bsa_sparse_attention_v3(q2, k2, v2, list(shape), txt_len=text,
                                              input_layout="BNSD", block_size=block,
                                              cached_mask=mask)
    assert returned is mask
    close(again, reference(q2, k2, v2, mask.bool(), order, block, "BNSD"))


# ---- sparse_type None --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_dense_type_ignores_mask_and_causal(layout):
    head_first = layout == "BNSD"
    b, sq, sk, n, kv_n, d = 2, 40, 72, 4, 2, 32
    generator = torch.Generator().manual_seed(2)
    q = torch.randn((b, n, sq, d) if head_first else (b, sq, n, d), generator=generator)
    kv_shape = (b, kv_n, sk, d) if head_first else (b, sk, kv_n, d)
    k, v = torch.randn(kv_shape, generator=generator), torch.randn(kv_shape, generator=generator)
    mask = torch.rand(sq, sk, generator=generator) > 0.5
    out = sparse_attention(q, k, v, attn_mask=mask, is_causal=True, scale=0.2, head_num=n,
                           input_layout=layout, sparsity=0.9, latent_shape_q=[1, 2, 3])
    close(out, reference_attention(q, k, v, scale=0.2, head_first=head_first)[0])


# ---- refused and bad inputs ------------------------------------------------------------------


def test_refused_features_name_themselves():
    q, k, v = inputs((1, 1, 128, 32), "BNSD", seed=1)
    with pytest.raises(FeatureNotSupported, match="ada_bsa"):
        sparse_attention(q, k, v, sparse_type="ada_bsa", sparsity=0.5)
    for refused in (ada_bsa.get_estimate_mask, ada_bsa.ada_block_sparse_attention):
        with pytest.raises(FeatureNotSupported, match=refused.__name__):
            refused(q, k, v)
    for precision in ("mix", "fp8"):
        with pytest.raises(FeatureNotSupported, match=precision):
            sparse_attention(q, k, v, sparse_type="rf_v3", latent_shape_q=[2, 8, 8],
                             precision=precision)


def test_bad_inputs_raise_parameters_invalid():
    shape = [2, 8, 8]
    q, k, v = inputs((1, 1, 128, 32), "BNSD", seed=1)
    rf = dict(sparse_type="rf_v2", latent_shape_q=shape)
    spans = [{"start": 0, "latent_shape": shape}]
    cases = [
        (dict(input_layout="BSH"), "input_layout"),
        (dict(sparse_type="rf_v1"), "sparse_type"),
        (dict(video_spans=spans), "video_spans"),
        (dict(sparse_type="rf_v2", video_spans=spans, txt_len=4), "excludes"),
        (dict(sparse_type="rf_v2", video_spans=spans, latent_shape_q=shape), "excludes"),
        (dict(sparse_type="rf_v2"), "latent_shape_q"),
        (dict(sparse_type="rf_v2", latent_shape_q=[2, 8]), "latent_shape_q"),
        (dict(sparse_type="rf_v2", latent_shape_q=[2, 8, 9]), "sequence length"),
        (dict(rf, txt_len=-1), "txt_len"),
        (dict(rf, sparsity=1.5), "sparsity"),
        (dict(rf, sparsity=-0.1), "sparsity"),
        (dict(rf, block_size=96), "block_size"),
        (dict(sparse_type="rf_v3", latent_shape_q=shape, precision="int4"), "precision"),
        (dict(sparse_type="rf_v2", video_spans="0:128"), "sequence of span"),
        (dict(sparse_type="rf_v2", video_spans=[]), "at least one"),
        (dict(sparse_type="rf_v2", video_spans=[[0, shape]]), "mapping"),
        (dict(sparse_type="rf_v2", video_spans=[{"start": 0}]), "latent_shape"),
        (dict(sparse_type="rf_v2", video_spans=[{"start": 0, "latent_shape": [2, 0, 8]}]),
         "positive"),
        (dict(sparse_type="rf_v2", video_spans=[{"start": 8, "latent_shape": shape}]), "passes"),
        (dict(sparse_type="rf_v2", video_spans=[{"start": 0, "latent_shape": [1, 8, 8]},
                                                {"start": 32, "latent_shape": [1, 8, 8]}]),
         "overlaps"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ParametersInvalid, match=match):
            sparse_attention(q, k, v, **kwargs)
    # rf_v2 and rf_v3 permute q, k and v alike: one shape (no GQA, no cross-attention).
    with pytest.raises(ParametersInvalid, match="one shape"):
        sparse_attention(q, k[:, :, :64], v[:, :, :64], **rf)
    with pytest.raises(ParametersInvalid, match="4-D"):
        sparse_attention(q[0], k[0], v[0], **rf)
    with pytest.raises(ParametersInvalid, match="cached_mask"):
        bsa_sparse_attention_v3(q, k, v, shape, input_layout="BNSD", block_size=64,
                                cached_mask=torch.ones(1, 1, 3, 3, dtype=torch.int8))


# ---- rain_fusion_attention: the kernel entry real code calls with its own block choice ---------


def gathered_reference(q, k, v, select_idx, select_num_idx, block, lengths, lengths_kv):
    """MindIE-SD's RainFusion kernel in float64, sequence by sequence (q, k, v [T, N, D] packed):
    each query block of head n attends to the concatenation of the key blocks its row lists, of
    key head n // (N / N_kv); a block listing none is zero."""
    heads, group = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[:2] + v.shape[2:], dtype=torch.float64)
    row = start = start_kv = 0
    for length, length_kv in zip(lengths, lengths_kv):
        for first in range(0, length, block):
            rows = slice(start + first, start + min(first + block, length))
            for n in range(heads):
                listed = select_idx[row, n, :select_num_idx[row, n]].tolist()
                keys = [k[start_kv + j * block:start_kv + min((j + 1) * block, length_kv),
                          n // group] for j in listed]
                if not keys:
                    continue
                values = [v[start_kv + j * block:start_kv + min((j + 1) * block, length_kv),
                            n // group] for j in listed]
                kk, vv = torch.cat(keys).double(), torch.cat(values).double()
                weights = torch.softmax(q[rows, n].double() @ kk.T / math.sqrt(q.shape[-1]), -1)
                out[rows, n] = weights @ vv
            row += 1
        start, start_kv = start + length, start_kv + length_kv
    return out


def random_selection(rows, heads, key_blocks, width=None):
    """MindIE-SD's index form of a random block choice: ascending kept blocks, -1 after them;
    some rows keep nothing."""
    width = key_blocks if width is None else width
    keep = torch.rand(rows, heads, key_blocks) < 0.5
    keep[0, 0] = False
    counts = keep.sum(-1)
    order = torch.where(keep, torch.arange(key_blocks), key_blocks).sort(-1).values
    index = torch.where(torch.arange(key_blocks) < counts[..., None], order, -1)
    return index[..., :width].contiguous(), counts


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("shared", [True, False])
def test_rain_fusion_attention_keeps_the_listed_blocks(layout, shared):
    from ditops.mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2 import rain_fusion_attention

    batch, heads, kv_heads, seq, seq_kv, dim, block = 2, 4, 2, 200, 264, 32, 64
    q = torch.randn(batch, seq, heads, dim)
    k, v = torch.randn(batch, seq_kv, kv_heads, dim), torch.randn(batch, seq_kv, kv_heads, dim)
    q_blocks, k_blocks = -(-seq // block), -(-seq_kv // block)
    index, counts = random_selection(q_blocks * (1 if shared else batch), heads, k_blocks)
    to_layout = (lambda x: x.transpose(1, 2)) if layout == "BNSD" else (lambda x: x)
    out = rain_fusion_attention(to_layout(q), to_layout(k), to_layout(v), head_num=heads,
                                input_layout=layout, select_idx=index, select_num_idx=counts,
                                blockshape=[block, block], actual_seq_lengths=[seq] * batch,
                                actual_seq_lengths_kv=[seq_kv] * batch)
    if shared:
        index, counts = index.repeat(batch, 1, 1), counts.repeat(batch, 1)
    want = gathered_reference(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), index, counts,
                              block, [seq] * batch, [seq_kv] * batch)
    close(to_layout(out).flatten(0, 1), want, torch.float32)


def test_rain_fusion_attention_packed_sequences():
    from ditops.mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2 import rain_fusion_attention

    lengths, lengths_kv, heads, dim, block = [130, 70], [200, 64], 2, 16, 64
    q = torch.randn(sum(lengths), heads, dim)
    k, v = torch.randn(sum(lengths_kv), heads, dim), torch.randn(sum(lengths_kv), heads, dim)
    rows = [-(-length // block) for length in lengths]
    parts = [random_selection(r, heads, -(-length_kv // block), width=4)
             for r, length_kv in zip(rows, lengths_kv)]
    index = torch.cat([torch.nn.functional.pad(i, (0, 4 - i.shape[-1]), value=-1)
                       for i, _ in parts])
    counts = torch.cat([c for _, c in parts])
    out = rain_fusion_attention(q, k, v, scale=dim ** -0.5, head_num=heads, input_layout="TND",
                                select_idx=index, select_num_idx=counts, blockshape=[64, 64],
                                actual_seq_lengths=lengths, actual_seq_lengths_kv=lengths_kv)
    close(out, gathered_reference(q, k, v, index, counts, block, lengths, lengths_kv),
          torch.float32)


def test_rain_fusion_attention_refuses_what_it_cannot_read():
    from ditops.mindiesd.layers.flash_attn.sparse_flash_attn_rf_v2 import rain_fusion_attention

    q = torch.randn(1, 2, 128, 16)
    index, counts = random_selection(2, 2, 2)
    good = dict(input_layout="BNSD", select_idx=index, select_num_idx=counts,
                blockshape=[64, 64])
    for change, message in [
        (dict(blockshape=[128, 64]), "must be square"),
        (dict(blockshape=[32, 32]), "must be square with a side in"),
        (dict(select_idx=index + 5), "outside"),
        (dict(select_idx=index[:1], select_num_idx=counts[:1]), "select_idx has 1 rows"),
        (dict(select_num_idx=counts + 3), "select_num_idx must lie in"),
        (dict(select_idx=index.float()), "must be an integer tensor"),
        (dict(actual_seq_lengths=[100]), "must equal the BNSD tensors' sequence length"),
        (dict(input_layout="TND"), "must be a 3-D torch tensor"),
        (dict(select_idx=None), "are required"),
    ]:
        with pytest.raises(ParametersInvalid, match=message):
            rain_fusion_attention(q, q, q, **{**good, **change})
    with pytest.raises(ParametersInvalid, match="needs actual_seq_lengths"):
        rain_fusion_attention(q[0], q[0], q[0], **{**good, "input_layout": "TND"})
    with pytest.raises(TypeError, match="rain_fusion_attention: key must be"):
        rain_fusion_attention(q, "k", q, **good)
    with pytest.raises(TypeError, match="rain_fusion_attention: value must be a torch.Tensor"):
        rain_fusion_attention(q, q, q.numpy(), **good)
    packed = {**good, "input_layout": "TND", "actual_seq_lengths_kv": [128]}
    for lengths in (128, "ab", [0]):
        with pytest.raises(ParametersInvalid, match="actual_seq_lengths must"):
            rain_fusion_attention(q[0], q[0], q[0], **packed, actual_seq_lengths=lengths)


def test_the_helpers_refuse_what_is_not_a_tensor():
    from ditops.mindiesd.layers.flash_attn import sparse_flash_attn_rf_v2 as rf

    x = torch.randn(1, 2, 64, 8)
    for call, args in [
        (rf.avgpool, ("x",)),
        (rf.get_mask_index, ([[True]],)),
        (rf.rearrange_with_remaining, (None, (1, 8, 8), (1, 8, 8), "BNSD")),
        (rf.inv_rearrange_with_remaining, (x.numpy(), (1, 8, 8), (1, 8, 8), "BNSD")),
        (rf.do_tensor_rearrange_pooling, (x, "k", x, 0, 64, (1, 8, 8), (1, 8, 8), "BNSD")),
        (rf.do_tensor_inv_rearrange, ("x", 0, (1, 8, 8), (1, 8, 8), "BNSD")),
        (rf.get_blockwise_mask, (None, 0, 0.5, 1.0, 64, (1, 8, 8), (1, 8, 8), "BNSD")),
    ]:
        with pytest.raises(TypeError, match=f"ditops.{call.__name__}: .* must be a torch.Tensor"):
            call(*args)


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("shape, text", [((4, 8, 16), 0), ((4, 8, 16), 64), ((3, 10, 12), 0)])
def test_the_helpers_that_build_the_index_form(layout, shape, text):
    """3.1.0's helpers, as code that calls rain_fusion_attention itself strings them: the order,
    the pooling, the choice in index form, the kernel, the inverse order; against the rule
    computed here (the pooled blocks coincide with the kernel's where the video fills whole
    blocks)."""
    from ditops.mindiesd.layers.flash_attn import sparse_flash_attn_rf_v2 as rf

    block, sparsity, heads = 64, 0.5, 2
    tokens = text + math.prod(shape)
    q, k, v = inputs((1, heads, tokens, 32), layout, seed=7)
    dim = 2 if layout == "BNSD" else 1
    order = layout_order(shape, text)[0]
    q2, k2, v2, pooled = rf.do_tensor_rearrange_pooling(q, k, v, text, block, shape, shape, layout)
    assert torch.equal(q2, q.index_select(dim, torch.tensor(order)))
    assert torch.equal(rf.do_tensor_inv_rearrange(q2, text, shape, shape, layout), q)
    video = q.narrow(dim, text, tokens - text)
    assert torch.equal(rf.inv_rearrange_with_remaining(
        rf.rearrange_with_remaining(video, shape, shape, layout), shape, shape, layout), video)
    blocks = [q2.narrow(dim, start, min(block, tokens - start)).mean(dim, keepdim=True)
              for start in range(0, tokens, block)]
    if math.prod(shape) % block == 0:
        close(torch.chunk(pooled, 3)[0], torch.cat(blocks, dim), torch.float32)
    select_idx, select_num_idx = rf.get_blockwise_mask(pooled, text, sparsity, 32 ** -0.5, block,
                                                       shape, shape, layout)
    out = rf.rain_fusion_attention(q2, k2, v2, scale=32 ** -0.5, head_num=heads,
                                   input_layout=layout, select_idx=select_idx,
                                   select_num_idx=select_num_idx, blockshape=[block, block])
    out = rf.do_tensor_inv_rearrange(out, text, shape, shape, layout)
    if math.prod(shape) % block:
        return  # 3.1.0 pools the video's short last block alone: the rule's blocks differ
    qb, kb = to_bnsd(q, layout), to_bnsd(k, layout)
    mask = block_choice(qb, kb, order, block, sparsity, 32 ** -0.5,
                        layout_order(shape, text)[1](block))
    binary = rf.get_blockwise_mask(pooled, text, sparsity, 32 ** -0.5, block, shape, shape, layout,
                                   return_binary=True)
    assert torch.equal(binary.bool(), mask)
    assert torch.equal(rf.get_mask_index(mask)[0, 1, 0, :int(mask[0, 1, 0].sum())],
                       torch.nonzero(mask[0, 1, 0]).flatten())
    close(out, reference(q, k, v, mask, order, block, layout), torch.float32)
    assert_sparse_matters(out, q, k, v, layout)
