"""Real models we did not write: diffusers' FLUX, Wan 2.x, CogVideoX and HunyuanVideo
transformers from small random configurations, run with diffusers' own attention and after
ditops.diffusers.enable(model): the outputs agree, ditops' kernels were the ones called, and
disable(model) gives diffusers' output back bit for bit. Also torch.compile(fullgraph=True) of
an enabled model, ditops.quantize on a W8A8 export that tools/ditops-quantize wrote, and
optimize(cache=) (MindIE-SD's CacheAgent on the model's blocks) in a denoising loop."""

import functools
import importlib
import os
import pathlib
import subprocess

import pytest
import torch

import ditops
import ditops.diffusers
import ditops.diffusers.backends
import models
from ditops.mindiesd import CacheConfig
from ditops.mindiesd.utils.exception import ConfigError
from test_mindiesd_cache import TIMESTEP_SCALE, denoise, small_model


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of ditops' attention, RMSNorm and rotary embedding."""
    # The backends call ditops' attention with torch's mask meaning (ops._attention), and
    # RainFusion's rf_v2 attention as ditops.diffusers.backends imported it.
    where = {"attention_forward": (ditops.ops, "_attention"),
             "rms_norm": (ditops.ops, "rms_norm"),
             "rotary_position_embedding": (ditops.ops, "rotary_position_embedding"),
             "rms_norm_rotary_position_embedding": (ditops.ops,
                                                    "rms_norm_rotary_position_embedding"),
             "sparse_attention": (ditops.diffusers.backends, "rainfusion_v2_attention")}
    calls = dict.fromkeys(where, 0)
    for name, (module, attribute) in where.items():
        original = getattr(module, attribute)

        def counting(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, attribute, counting)
    return calls


# Agreement with diffusers' own attention. fp32: flash attention's sums differ from SDPA's in
# rounding only (~1e-6 relative per attention), which the models' few layers keep below 1e-4.
# bf16: every layer rounds activations to bf16 (2^-8 relative); both paths round differently,
# so whole-model outputs differ by a few bf16 roundings: 3e-2.
@pytest.mark.parametrize("name", list(models.MODELS))
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)],
                         ids=["f32", "bf16"])
def test_enabled_model_matches_diffusers(name, dtype, tolerance, counted):
    model, inputs = models.MODELS[name](dtype)
    want = model(**inputs)[0]
    ditops.diffusers.enable(model)
    got = model(**inputs)[0]
    assert counted["attention_forward"] > 0
    if name in ("wan", "hunyuan"):  # q/k RMSNorm (CogVideoX's are LayerNorms)
        assert counted["rms_norm"] > 0
    if name == "wan":
        # Self-attention's q/k RMSNorm and rotary embedding run fused (q and k per layer), the
        # cross-attention's norms alone.
        assert counted["rms_norm_rotary_position_embedding"] == 2 * len(model.blocks)
        assert counted["rotary_position_embedding"] == 0
    elif name == "flux":
        # Every q/k RMSNorm runs fused with the rotary embedding: q and k of the joint blocks
        # per segment (text, image), of the single blocks whole.
        assert counted["rms_norm_rotary_position_embedding"] == (
            4 * len(model.transformer_blocks) + 2 * len(model.single_transformer_blocks))
        assert counted["rotary_position_embedding"] == counted["rms_norm"] == 0
    else:
        assert counted["rotary_position_embedding"] > 0
    assert rel_l2(got, want) <= tolerance, rel_l2(got, want)
    ditops.diffusers.disable(model)
    assert torch.equal(model(**inputs)[0], want)


def test_enabling_one_model_leaves_the_others_on_diffusers(counted):
    enabled, inputs = models.flux()
    other, _ = models.flux()
    ditops.diffusers.enable(enabled)
    want = enabled(**inputs)[0]
    calls = counted["attention_forward"]
    assert calls > 0
    got = other(**inputs)[0]
    assert counted["attention_forward"] == calls  # the other model ran diffusers' attention
    assert rel_l2(got, want) <= 1e-4
    ditops.diffusers.disable(enabled)


def test_int8_and_rainfusion_backends_run_on_wan(counted):
    model, inputs = models.wan(frames=4, height=32, width=32)
    want = model(**inputs)[0]
    ditops.diffusers.enable(model, backend="int8")
    assert rel_l2(model(**inputs)[0], want) < 5e-2  # int8 Q·K and P·V
    ditops.diffusers.enable(model, backend="rainfusion", sparsity=0.5, block_size=64)
    sparse = model(**inputs)[0]
    assert counted["sparse_attention"] > 0
    assert torch.isfinite(sparse).all() and rel_l2(sparse, want) < 1.0
    ditops.diffusers.enable(model, backend="rainfusion", sparsity=0.0, block_size=64)
    assert rel_l2(model(**inputs)[0], want) < 1e-4  # sparsity 0 keeps every block
    ditops.diffusers.disable(model)
    assert torch.equal(model(**inputs)[0], want)


def test_compiled_enabled_model_agrees():
    model, inputs = models.flux()
    want = model(**inputs)[0]
    ditops.diffusers.enable(model)
    compiled = torch.compile(model, fullgraph=True)  # inductor: ditops' ops stay opaque calls
    assert rel_l2(compiled(**inputs)[0], want) <= 1e-4
    ditops.diffusers.disable(model)


def tools_dir():
    directory = os.environ.get("DITOPS_TOOLS_DIR")
    if directory is None:
        directory = pathlib.Path(__file__).resolve().parents[2] / "build" / "release" / "tools"
    return pathlib.Path(directory)


def test_quantize_runs_a_w8a8_export_of_the_model(tmp_path):
    from safetensors.torch import save_file

    model, inputs = models.flux(layers=1)
    want = model(**inputs)[0]
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    quantize = tools_dir() / "ditops-quantize"
    assert quantize.exists(), f"{quantize} is not built (set DITOPS_TOOLS_DIR)"
    subprocess.run([str(quantize), "--weights", str(weights), "--out", str(tmp_path),
                    "--algo", "W8A8_DYNAMIC"], check=True, capture_output=True)
    description = tmp_path / "quant_model_description_w8a8_dynamic.json"
    ditops.quantize(model, description)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model._ditops_quantized_layers > 10 and linears == 0
    got = model(**inputs)[0]
    # Per-channel int8 weights and per-token int8 activations through a few layers.
    assert rel_l2(got, want) < 5e-2, rel_l2(got, want)
    with ditops.diffusers.enabled(model):
        assert rel_l2(model(**inputs)[0], want) < 5e-2


def test_the_supported_range_is_pyprojects():
    pyproject = (pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text()
    (low_major, low_minor), (high_major, high_minor) = ditops.diffusers.SUPPORTED_DIFFUSERS
    assert f'"diffusers>={low_major}.{low_minor},<{high_major}.{high_minor}"' in pyproject


def test_diffusers_versions_outside_the_range_are_refused_by_name(monkeypatch):
    monkeypatch.delenv("DITOPS_ANY_DIFFUSERS", raising=False)
    (low_major, low_minor), (high_major, high_minor) = ditops.diffusers.SUPPORTED_DIFFUSERS
    for version in (f"{low_major}.{low_minor}.0", f"{high_major}.{high_minor - 1}.9",
                    f"{low_major}.{low_minor}.2.dev0"):
        ditops.diffusers.check_diffusers_version(version)
    for version in (f"{low_major}.{low_minor - 1}.9", f"{high_major}.{high_minor}.0",
                    f"{high_major}.{high_minor}.0.dev0", "1.0.0", "unknown"):
        with pytest.raises(RuntimeError, match=rf"diffusers {version} is outside the supported "
                                               rf"range >={low_major}\.{low_minor},<"):
            ditops.diffusers.check_diffusers_version(version)
    monkeypatch.setenv("DITOPS_ANY_DIFFUSERS", "1")
    ditops.diffusers.check_diffusers_version("1.0.0")


def test_enable_refuses_an_unsupported_diffusers_before_touching_the_model(monkeypatch):
    import diffusers

    monkeypatch.delenv("DITOPS_ANY_DIFFUSERS", raising=False)
    model, inputs = models.MODELS["flux"](torch.float32)
    want = model(**inputs)[0]
    processors = dict(model.attn_processors)
    monkeypatch.setattr(diffusers, "__version__", "9.0.0")
    with pytest.raises(RuntimeError, match="diffusers 9.0.0 is outside the supported range"):
        ditops.diffusers.enable(model)
    assert not ditops.diffusers.is_optimized(model)
    assert dict(model.attn_processors) == processors
    assert torch.equal(model(**inputs)[0], want)


def test_runs_on_the_diffusers_release_it_was_given():
    """ctest's python.diffusers_lowest puts the lowest supported release first on the path."""
    import diffusers

    expected = os.environ.get("DITOPS_EXPECT_DIFFUSERS")
    if not expected:
        pytest.skip("DITOPS_EXPECT_DIFFUSERS not set: the venv's diffusers")
    assert diffusers.__version__ == expected


# optimize(): attention, norms, RoPE and every nn.Linear on ditops. Tolerances as for enable
# above, the linears adding one fp32 GEMM's rounding per layer (fp32) or the bf16 rounding of
# each layer's output, as torch's own bf16 linears do (bf16); W8A8 dynamic quantization (int8
# weights per channel, activations per token) measured 0.7-1.4e-3 on these models in fp32 and
# 3-4e-3 in bf16: 1e-2 and 3e-2.
@pytest.mark.parametrize("name", ["flux", "wan"])
@pytest.mark.parametrize("dtype,quantize,tolerance",
                         [(torch.float32, None, 1e-4), (torch.bfloat16, None, 3e-2),
                          (torch.float32, "w8a8_dynamic", 1e-2),
                          (torch.bfloat16, "w8a8_dynamic", 3e-2)],
                         ids=["f32", "bf16", "f32-w8a8", "bf16-w8a8"])
def test_optimize_runs_every_linear_on_ditops_and_disable_restores_the_model(
        name, dtype, quantize, tolerance, counted):
    from ditops.quant import QuantLinear

    model, inputs = models.MODELS[name](dtype)
    linears = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    want = model(**inputs)[0]
    report = ditops.diffusers.optimize(model, quantize=quantize, bf16_linears="ditops")
    got = model(**inputs)[0]
    assert got.dtype == dtype and counted["attention_forward"] > 0
    assert rel_l2(got, want) < tolerance
    # Every nn.Linear is a ditops layer now, and the report names each one once.
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    on_ditops = report.on_ditops.get("float linears", []) + report.on_ditops.get(
        "w8a8_dynamic linears", [])
    assert sorted(on_ditops) == sorted(linears) and not report.on_torch
    replaced = dict(model.named_modules())
    assert all(isinstance(replaced[n], QuantLinear) for n in linears)
    if quantize is None:
        assert "w8a8_dynamic linears" not in report.on_ditops
    else:
        # The embedders, modulation and final projection stay in floating point.
        kept = report.on_ditops["float linears"]
        assert "proj_out" in kept and any("embed" in n for n in kept)
        assert all(replaced[n].layer.algo == "FLOAT" for n in kept)
        quantized = report.on_ditops["w8a8_dynamic linears"]
        assert any(".ff." in n or ".ffn." in n for n in quantized)
        assert all(replaced[n].layer.algo == "W8A8_DYNAMIC" for n in quantized)
    assert report.weight_bytes > 0 and "on ditops" in str(report)
    ditops.diffusers.disable(model)
    assert all(dict(model.named_modules())[n] is m for n, m in linears.items())
    assert torch.equal(model(**inputs)[0], want)


@pytest.mark.parametrize("bf16_linears", ["auto", "torch"])
def test_optimize_leaves_bf16_float_linears_to_torch_where_its_bf16_gemm_is_faster(bf16_linears):
    """"torch", and "auto" on a CPU with full-rate bf16 dot products or AMX (cpu_info), keep
    the FLOAT layers of a bf16 model on torch, saying why; W8A8 layers still go to ditops, and
    an fp32 model's FLOAT layers too."""
    on_torch = bf16_linears == "torch" or ditops.cpu_info()["bf16_dot_full_rate"]
    for dtype, quantize in ((torch.bfloat16, None), (torch.bfloat16, "w8a8_dynamic"),
                            (torch.float32, None)):
        model, inputs = models.MODELS["flux"](dtype)
        want = model(**inputs)[0]
        report = ditops.diffusers.optimize(model, quantize=quantize, bf16_linears=bf16_linears)
        stays = [name for name, why in report.on_torch.items() if "bf16 weights" in why]
        if dtype == torch.bfloat16 and on_torch:
            assert stays and "float linears" not in report.on_ditops
            assert all(type(model.get_submodule(name)) is torch.nn.Linear for name in stays)
            assert ("w8a8_dynamic linears" in report.on_ditops) == (quantize is not None)
        else:
            assert not stays and report.on_ditops["float linears"]
        assert rel_l2(model(**inputs)[0], want) < 3e-2
        ditops.diffusers.disable(model)


def test_optimize_takes_a_pipeline_and_refuses_bad_arguments():
    model, inputs = models.MODELS["flux"](torch.float32)

    class Pipeline:  # what optimize reads of a diffusers pipeline
        transformer = model

    report = ditops.diffusers.optimize(Pipeline(), keep_float=("*",), quantize="w8a8_dynamic")
    assert "w8a8_dynamic linears" not in report.on_ditops  # "*" keeps every layer in float
    ditops.diffusers.disable(model)
    ditops.diffusers.optimize(model)
    with pytest.raises(ValueError, match="optimize already put this model's linear layers"):
        ditops.quantize(model, online_config=ditops.OnlineQuantConfig())
    ditops.diffusers.disable(model)
    with pytest.raises(ValueError, match="quantize 'int4' is not one of"):
        ditops.diffusers.optimize(model, quantize="int4")
    with pytest.raises(ValueError, match="bf16_linears 'cpu' is not one of"):
        ditops.diffusers.optimize(model, bf16_linears="cpu")
    with pytest.raises(ValueError, match="expected a diffusers transformer or a pipeline"):
        ditops.diffusers.optimize(object())
    for wrong in ("model", None, torch.nn.Linear(2, 2)):
        with pytest.raises(TypeError, match="enable: model must be a diffusers transformer"):
            ditops.diffusers.enable(wrong)
    assert not ditops.diffusers.is_optimized(model)


# ---- optimize(cache=): MindIE-SD's CacheAgent on the blocks, in a denoising loop ---------------
# The models and the loop are test_mindiesd_cache's: FLUX with 2 double- and 2 single-stream
# blocks, Wan with 3 blocks; 6 flow-matching Euler steps, one call of the model per step.

STEPS = 6


def blocks_of(model):
    """The model's blocks in the order its forward runs them (one sequence, as the agent counts)."""
    if hasattr(model, "single_transformer_blocks"):
        return [*model.transformer_blocks, *model.single_transformer_blocks]
    return list(model.blocks)


def attentions_of(model):
    """The self-attention of every block (FLUX: attn; Wan: attn1), which attention_cache wraps."""
    return [block.attn if hasattr(block, "attn") else block.attn1 for block in blocks_of(model)]


def loop(model, inputs, name):
    """The velocity the model returned at each step of the loop, and the final latent."""
    velocities = []
    hook = model.register_forward_hook(lambda module, args, out: velocities.append(out[0]))
    latent = denoise(model, inputs, STEPS, TIMESTEP_SCALE[name])
    hook.remove()
    return velocities, latent


def count_forwards(modules):
    """Counts the forwards the modules run: a counting forward on each instance (as accelerate's
    hooks install one), which optimize's cache wraps and disable must give back."""
    calls = [0]
    for module in modules:
        def counting(*args, _forward=module.forward, **kwargs):
            calls[0] += 1
            return _forward(*args, **kwargs)
        module.forward = counting
    return calls


def cache_config(method, model, **fields):
    blocks = len(blocks_of(model))
    if method == "dit_block_cache":
        fields.setdefault("block_end", blocks)  # the default 10000 is refused past the blocks
    return CacheConfig(method=method, blocks_count=blocks, steps_count=STEPS, **fields)


# A schedule that caches nothing (step_interval 1: the agent calls the forward as given), or one
# that caches but computes every step (its only refresh step is the last): the wrapped forwards
# run the same modules on the same tensors, so the loop equals optimize's without cache bit for
# bit (for FLUX this also checks that the (encoder, hidden) order comes back as the model's).
@pytest.mark.parametrize("fields", [dict(step_interval=1), dict(step_start=STEPS - 1,
                                                                 step_interval=2)],
                         ids=["interval1", "refresh_on_the_last_step"])
@pytest.mark.parametrize("method", ["dit_block_cache", "attention_cache"])
@pytest.mark.parametrize("name", ["flux", "wan"])
def test_optimize_cache_that_computes_every_step_equals_optimize_without_cache(name, method,
                                                                               fields):
    model, inputs = small_model(name, torch.float32)
    ditops.diffusers.optimize(model)
    want, want_latent = loop(model, inputs, name)
    report = ditops.diffusers.optimize(model, cache=cache_config(method, model, **fields))
    got, latent = loop(model, inputs, name)
    assert len(report.on_ditops["step cache"]) == len(blocks_of(model))
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and torch.equal(latent, want_latent)
    ditops.diffusers.disable(model)


# Reuse steps against the uncached loop: a skipped range adds the residual its blocks added one
# step earlier (attention_cache: the attentions of one step earlier), whose timestep and latent
# differ from this step's by one Euler step (1/6 of the way here, a coarse loop); the refresh
# steps after it compute from a latent that drifted a little. Measured on these random models
# (fp32), rel-L2 against the uncached loop: dit_block_cache 2.0-2.6e-2 on the reuse steps,
# 2-3e-3 on the later refresh steps and the final latent; attention_cache 4-6e-3 and 5-9e-4.
# Bounds (dit_block_cache, attention_cache): 3.5e-2 and 1e-2 per step, 1e-2 and 2e-3 for the
# latent. Skipping FLUX's range without adding the residual measured 5-6e-2 on the reuse steps
# (above the bound), and not swapping FLUX's (encoder, hidden) pair for the agent fails outright
# (text and image token counts differ). The steps before the first reuse are bit for bit.
CACHE_TOLERANCE = {"dit_block_cache": (3.5e-2, 1e-2), "attention_cache": (1e-2, 2e-3)}


@pytest.mark.parametrize("name,method", [("flux", "dit_block_cache"), ("wan", "dit_block_cache"),
                                         ("flux", "attention_cache")])
def test_optimize_cache_skips_the_reuse_steps_work_and_stays_close(name, method):
    model, inputs = small_model(name, torch.float32)
    blocks = len(blocks_of(model))
    ditops.diffusers.optimize(model)
    want, want_latent = loop(model, inputs, name)
    sites = blocks_of(model) if method == "dit_block_cache" else attentions_of(model)
    calls = count_forwards(sites)
    # From step 1, every 2nd step refreshes (1, 3, 5) and the steps between reuse (2, 4):
    # dit_block_cache skips blocks [1, blocks) there, attention_cache every self-attention.
    config = cache_config(method, model, step_start=1, step_interval=2, block_start=1)
    report = ditops.diffusers.optimize(model, cache=config)
    assert report.cache is config and "step cache" in str(report)
    got, latent = loop(model, inputs, name)
    skipped = blocks - 1 if method == "dit_block_cache" else blocks
    assert calls[0] == STEPS * blocks - 2 * skipped
    step_tolerance, latent_tolerance = CACHE_TOLERANCE[method]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for step in range(2, STEPS):
        assert rel_l2(got[step], want[step]) < step_tolerance, (step, rel_l2(got[step],
                                                                             want[step]))
    for step in (2, 4):
        assert not torch.equal(got[step], want[step])
    assert rel_l2(latent, want_latent) < latent_tolerance, rel_l2(latent, want_latent)
    # A second generation restarts the schedule: the same loop again, the same outputs.
    calls[0] = 0
    again, again_latent = loop(model, inputs, name)
    assert calls[0] == STEPS * blocks - 2 * skipped and torch.equal(again_latent, latent)
    ditops.diffusers.disable(model)


@pytest.mark.parametrize("method", ["dit_block_cache", "attention_cache"])
@pytest.mark.parametrize("name", ["flux", "wan"])
def test_optimize_cache_names_what_it_wraps_and_disable_restores_the_forwards(name, method):
    model, inputs = small_model(name, torch.float32)
    want, want_latent = loop(model, inputs, name)
    sites = blocks_of(model) if method == "dit_block_cache" else attentions_of(model)
    others = attentions_of(model) if method == "dit_block_cache" else blocks_of(model)
    counting = sites[0]  # one site with an instance forward of its own before optimize
    count_forwards([counting])
    counter = vars(counting)["forward"]
    report = ditops.diffusers.optimize(model, cache=cache_config(method, model, step_start=1,
                                                                 step_interval=2))
    lists = (["transformer_blocks.0", "transformer_blocks.1", "single_transformer_blocks.0",
              "single_transformer_blocks.1"] if name == "flux"
             else ["blocks.0", "blocks.1", "blocks.2"])
    suffix = "" if method == "dit_block_cache" else ".attn" if name == "flux" else ".attn1"
    assert report.on_ditops["step cache"] == [n + suffix for n in lists]
    modules = dict(model.named_modules())
    assert [modules[n] for n in report.on_ditops["step cache"]] == sites
    assert all(vars(site)["forward"].__wrapped__ is not None for site in sites)
    assert all("forward" not in vars(other) for other in others)
    # optimize again replaces the wrapping (the forwards it wraps are the original ones)
    ditops.diffusers.optimize(model, cache=cache_config(method, model, step_interval=3))
    assert vars(counting)["forward"].__wrapped__ is counter
    ditops.diffusers.disable(model)
    assert vars(counting)["forward"] is counter
    for site in sites[1:]:
        assert "forward" not in vars(site) and site.forward.__func__ is type(site).forward
    del counting.forward
    got, latent = loop(model, inputs, name)
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and torch.equal(latent, want_latent)


def test_optimize_cache_fills_blocks_count_0_and_refuses_bad_configs():
    model, inputs = small_model("flux", torch.float32)
    want = model(**inputs)[0]
    # blocks_count 0: optimize fills in the model's count, in a copy of the config.
    given = CacheConfig("dit_block_cache", 0, STEPS, step_interval=2, block_end=4)
    report = ditops.diffusers.optimize(model, cache=given)
    assert report.cache is not given and given.blocks_count == 0
    assert report.cache == CacheConfig("dit_block_cache", 4, STEPS, step_interval=2, block_end=4)
    ditops.diffusers.disable(model)
    refused = [
        (CacheConfig("block_cache", 4, STEPS), ConfigError, "method 'block_cache' is not one"),
        (CacheConfig("dit_block_cache", 3, STEPS, block_end=3), ValueError,
         r"optimize: cache.blocks_count is 3, but FluxTransformer2DModel runs 4 blocks"),
        (CacheConfig("attention_cache", 40, STEPS), ValueError,
         r"cache.blocks_count is 40, but FluxTransformer2DModel runs 4 blocks"),
        (CacheConfig("dit_block_cache", 0, STEPS), ConfigError,
         r"block_end \(10000\) must be <= blocks_count \(4\)"),
        (CacheConfig("attention_cache", 4, 0), ConfigError, "steps_count must be >= 1"),
        (dict(method="attention_cache", blocks_count=4, steps_count=STEPS), ValueError,
         "cache must be None or a ditops.CacheConfig, not dict"),
    ]
    for cache, error, message in refused:
        with pytest.raises(error, match=message):
            ditops.diffusers.optimize(model, cache=cache)
    other, _ = models.cogvideox()
    with pytest.raises(ValueError, match="cache= supports .* not CogVideoXTransformer3DModel"):
        ditops.diffusers.optimize(other, cache=CacheConfig("attention_cache", 2, STEPS))

    class Pipeline:  # Wan 2.2's two experts
        transformer = model
        transformer_2 = small_model("flux", torch.float32)[0]

    with pytest.raises(ValueError, match="pipeline of two transformers"):
        ditops.diffusers.optimize(Pipeline(), cache=CacheConfig("attention_cache", 4, STEPS))
    # Refused before anything of the models changed.
    for refused_model in (model, other, Pipeline.transformer_2):
        assert not ditops.diffusers.is_optimized(refused_model)
        assert not any("forward" in vars(m) for m in refused_model.modules())
    assert torch.equal(model(**inputs)[0], want)


def test_diffusers_private_names_resolve():
    """Every private name of diffusers the integration uses (ditops.diffusers._internals, the
    one module that imports diffusers) exists in the diffusers this runs with: the suite runs
    at both ends of SUPPORTED_DIFFUSERS."""
    from ditops.diffusers import _internals

    for module, name in _internals.PRIVATE_NAMES:
        functools.reduce(getattr, name.split("."), importlib.import_module(module))
