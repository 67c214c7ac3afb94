"""cache-dit 1.5.3 (from PyPI, code we did not write) on ditops through `import mindiesd`: its
MindIE-SD attention backend ("_mindiesd_laser") registers only when
`from mindiesd.layers import attention_forward` succeeds; selected the way cache-dit documents
(cache_dit.set_attn_backend), it runs a diffusers FLUX transformer on ditops' attention, alone
and under cache-dit's own caching (DBCache with a fixed step mask). Each case runs in a fresh
process: install() and cache-dit's registrations are process-wide."""

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
    if {cached!r}:
        mask = cache_dit.steps_mask(compute_bins=[2, 1, 1, 1], cache_bins=[1, 1, 1])
        config = cache_dit.DBCacheConfig(num_inference_steps=STEPS, Fn_compute_blocks=1,
                                         Bn_compute_blocks=0, steps_computation_mask=mask,
                                         steps_computation_policy="static")
        cache_dit.enable_cache(model, cache_config=config)
    native = denoise(model, inputs)
    if {cached!r}:
        native_cached = cache_dit.summary(model)[0].cached_steps
        cache_dit.refresh_context(model, num_inference_steps=STEPS)
    assert calls[0] == 0
    cache_dit.set_attn_backend(model, "_mindiesd_laser")
    ours = denoise(model, inputs)
print("calls", calls[0])
print("rel_l2", rel_l2(ours, native))
if {cached!r}:
    print("cached", native_cached, cache_dit.summary(model)[0].cached_steps)
"""


def run(cached):
    code = PROGRAM.format(tests=str(TESTS), cached=cached)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


def test_cache_dit_mindiesd_backend_runs_on_ditops():
    report = run(cached=False)
    # Two double-stream and two single-stream blocks, each one attention, eight steps.
    assert int(report["calls"]) == 4 * 8
    # fp32 flash attention against torch's SDPA: rounding only (see test_diffusers.py).
    assert float(report["rel_l2"]) < 1e-4


def test_cache_dit_caching_with_the_mindiesd_backend():
    report = run(cached=True)
    native_cached, ours_cached = report["cached"].split("] [")
    assert native_cached + "]" == "[2, 4, 6]" and "[" + ours_cached == "[2, 4, 6]"
    # Cached steps run only the first block (Fn_compute_blocks=1): 5 full steps of 4
    # attentions and 3 of 1.
    assert int(report["calls"]) == 5 * 4 + 3 * 1
    assert float(report["rel_l2"]) < 1e-4
