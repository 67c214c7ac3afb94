"""Real models we did not write: diffusers' FLUX, Wan 2.x, CogVideoX and HunyuanVideo
transformers from small random configurations, run with diffusers' own attention and after
ditops.diffusers.enable(model): the outputs agree, ditops' kernels were the ones called, and
disable(model) gives diffusers' output back bit for bit. Also torch.compile(fullgraph=True) of
an enabled model, and ditops.quantize on a W8A8 export that tools/ditops-quantize wrote."""

import os
import pathlib
import subprocess

import pytest
import torch

import ditops
import ditops.diffusers
import models


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of ditops' attention, RMSNorm and rotary embedding."""
    # The backends call ditops' attention with torch's mask meaning (ops._attention), and
    # RainFusion's rf_v2 attention as ditops.diffusers imported it.
    where = {"attention_forward": (ditops.ops, "_attention"),
             "rms_norm": (ditops.ops, "rms_norm"),
             "rotary_position_embedding": (ditops.ops, "rotary_position_embedding"),
             "rms_norm_rotary_position_embedding": (ditops.ops,
                                                    "rms_norm_rotary_position_embedding"),
             "sparse_attention": (ditops.diffusers, "rainfusion_v2_attention")}
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
    assert getattr(model, "_ditops_state", None) is None
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
    report = ditops.diffusers.optimize(model, quantize=quantize)
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
    with pytest.raises(ValueError, match="expected a diffusers transformer or a pipeline"):
        ditops.diffusers.optimize(object())
    assert getattr(model, "_ditops_state", None) is None
