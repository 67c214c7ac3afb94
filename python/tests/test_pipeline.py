"""Whole diffusers pipelines (FluxPipeline, WanPipeline) assembled from small random components,
nothing downloaded (models.flux_pipeline, models.wan_pipeline; bench/python/pipeline_speed.py
times them at full width): ditops.diffusers.optimize(pipe) on the whole pipeline, called as a
user calls it, gives the default's output closely; its report names the modules it replaced;
disable(pipe.transformer) gives the default's output back bit for bit."""

import numpy as np
import pytest
import torch

import ditops.diffusers
import models

pytest.importorskip("transformers")

# Two denoising steps at 64 x 64 (Wan: 5 frames, 2 latent frames), 16 text tokens: seconds.
CALLS = {
    "flux": dict(height=64, width=64),
    "wan": dict(height=64, width=64, num_frames=5),
}


def generate(pipe, name):
    """The decoded output (numpy, values in [0, 1]) and the final latents of one call."""
    latents = []

    def keep(pipe, step, timestep, kwargs):
        latents.append(kwargs["latents"].clone())
        return {}

    out = pipe("a red fox in the snow", num_inference_steps=2, max_sequence_length=16,
               generator=torch.Generator().manual_seed(0), output_type="np",
               callback_on_step_end=keep, **CALLS[name])
    return np.asarray(out.frames[0] if name == "wan" else out.images[0]), latents[-1]


# optimize() with quantize=None keeps every weight (FLOAT linears) and changes only the order
# of fp32 sums (ditops' GEMM and flash attention against torch's): ~1e-7 relative per layer.
# Over the transformers' few layers and two steps the final latents measured 1e-7 (FLUX) and
# 6e-7 (Wan) rel-L2 from the default's, and the VAE (the default's) turned that into pixel
# differences of 1.4e-6 on values in [0, 1]: 1e-4 for both leaves ~100x margin and still
# catches a wrong layer (a swapped or unscaled linear moves them by 1e-2 or more).
@pytest.mark.parametrize("name", list(models.PIPELINES))
def test_optimized_pipeline_matches_default_and_disable_restores(name):
    pipe = models.PIPELINES[name]()
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        want, want_latents = generate(pipe, name)
        report = ditops.diffusers.optimize(pipe)
        got, got_latents = generate(pipe, name)
        ditops.diffusers.disable(pipe.transformer)
        back, back_latents = generate(pipe, name)
    assert got.shape == want.shape
    rel_l2 = ((got_latents.double() - want_latents.double()).norm()
              / want_latents.double().norm()).item()
    assert rel_l2 < 1e-4
    assert np.abs(got - want).max() < 1e-4
    assert not torch.equal(got_latents, want_latents)  # ditops ran
    # The report names the transformer's modules: every attention processor, q/k norm and
    # linear layer, nothing left on torch.
    attention = "transformer_blocks.0.attn.processor" if name == "flux" else (
        "blocks.0.attn1.processor")
    linear = "transformer_blocks.0.attn.to_q" if name == "flux" else "blocks.0.attn1.to_q"
    assert attention in report.on_ditops["attention processors"]
    assert linear in report.on_ditops["float linears"]
    assert len(report.on_ditops["float linears"]) == sum(
        type(m) is torch.nn.Linear for m in pipe.transformer.modules())
    assert report.on_ditops["q/k norms"] and report.on_torch == {}
    assert report.attention == "dense" and "float linears" in str(report)
    # disable: the default model, bit for bit.
    assert np.array_equal(back, want) and torch.equal(back_latents, want_latents)
