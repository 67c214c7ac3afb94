"""cache-dit 1.5.3 (from PyPI, code we did not write) on ditops through `import mindiesd`: its
MindIE-SD attention backend ("_mindiesd_laser") registers only when
`from mindiesd.layers import attention_forward` succeeds; selected the way cache-dit documents
(cache_dit.set_attn_backend), it runs a diffusers FLUX transformer on ditops' attention, alone
and under cache-dit's own caching (DBCache with a fixed step mask), each against diffusers' own
attention. It runs in a fresh process: install() and cache-dit's registrations are
process-wide."""

import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

PROGRAM = """
import sys
import torch
sys.path.insert(0, {tests!r})
import ditops.mindiesd
ditops.mindiesd.install()
import cache_dit
import ditops.ops
import models
from cache_dit.attention.backends.register import _AttnBackendRegistry

calls = [0]
attention = ditops.ops._attention
def counting(*args, **kwargs):
    calls[0] += 1
    return attention(*args, **kwargs)
ditops.ops._attention = counting

STEPS = 8
def denoise(model, inputs):
    latent = inputs["hidden_states"].clone()
    for step in range(STEPS):
        timestep = torch.tensor([1 - step / STEPS])
        velocity = model(**dict(inputs, hidden_states=latent, timestep=timestep))[0]
        latent = latent - velocity / STEPS
    return latent

def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()

assert "_mindiesd_laser" in [b.value for b in _AttnBackendRegistry._backends], "not registered"
model, inputs = models.flux(height=16, width=16, layers=2)
with torch.inference_mode():
    native = denoise(model, inputs)
    assert calls[0] == 0
    cache_dit.set_attn_backend(model, "_mindiesd_laser")
    ours = denoise(model, inputs)
    print("calls", calls[0])
    print("rel_l2", rel_l2(ours, native))
    # cache-dit's DBCache with a fixed step mask, on ditops' attention, then on diffusers'.
    mask = cache_dit.steps_mask(compute_bins=[2, 1, 1, 1], cache_bins=[1, 1, 1])
    config = cache_dit.DBCacheConfig(num_inference_steps=STEPS, Fn_compute_blocks=1,
                                     Bn_compute_blocks=0, steps_computation_mask=mask,
                                     steps_computation_policy="static")
    cache_dit.enable_cache(model, cache_config=config)
    calls[0] = 0
    ours = denoise(model, inputs)
    ours_cached = cache_dit.summary(model)[0].cached_steps
    print("cached_calls", calls[0])
    cache_dit.set_attn_backend(model, "native")
    cache_dit.refresh_context(model, num_inference_steps=STEPS)
    before = calls[0]
    native = denoise(model, inputs)
    assert calls[0] == before, "the native loop ran on ditops"
    print("cached_rel_l2", rel_l2(ours, native))
    print("cached", ours_cached, cache_dit.summary(model)[0].cached_steps)
"""


def test_cache_dit_mindiesd_backend_alone_and_with_its_cache():
    code = PROGRAM.format(tests=str(TESTS))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    # Two double-stream and two single-stream blocks, each one attention, eight steps.
    assert int(report["calls"]) == 4 * 8
    # fp32 flash attention against torch's SDPA: rounding only (see test_diffusers.py).
    assert float(report["rel_l2"]) < 1e-4
    # Cached steps (2, 4, 6 under the mask) run only the first block (Fn_compute_blocks=1):
    # 5 full steps of 4 attentions and 3 of 1.
    assert report["cached"] == "[2, 4, 6] [2, 4, 6]"
    assert int(report["cached_calls"]) == 5 * 4 + 3 * 1
    assert float(report["cached_rel_l2"]) < 1e-4
