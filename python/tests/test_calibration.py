"""ditops.calibrate: the ranges its hooks record (against ranges computed here from the inputs
each layer is known to get), the steps it counts (one per timestep value, classifier-free
guidance's two calls sharing one, a new generation starting over), and export()'s msmodelslim
files, read with the reference safetensors package and checked against float64 math of the
documented arithmetic, then loaded by ditops.quantize and run; on a FLUX transformer, the
calibrated static and timestep exports against the float model."""

import json

import pytest
import torch
from safetensors.torch import load_file

import ditops
import models
from ditops.mindiesd.quantization import TimestepPolicyConfig, quantize


class TwoLayers(torch.nn.Module):
    """a: x -> 32, a LayerNorm without affine (so b's input is known), b: 32 -> 8; an
    embedding (a rank-2 weight that is no linear layer) and a linear layer that never runs."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32, elementwise_affine=False)
        self.b = torch.nn.Linear(32, 8)
        self.table = torch.nn.Embedding(4, 16)
        self.unused = torch.nn.Linear(8, 8)
        self.to(dtype)

    def forward(self, x, timestep=None):
        return self.b(self.norm(self.a(x)))


def ranges_of(x):
    x = x.reshape(-1, x.shape[-1]).double()
    return torch.stack([x.amax(0), x.amin(0)])


def union(first, second):
    return torch.stack([torch.maximum(first[0], second[0]), torch.minimum(first[1], second[1])])


def rel_l2(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def calibrated(dtype):
    """TwoLayers run for a 3-step generation with two calls per step (guidance's), then a
    second generation of 2 steps; the ranges each layer saw per step, computed here."""
    model = TwoLayers(dtype)
    expected = {"a": {}, "b": {}}
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad(), ditops.calibrate(model) as calibration:
        for timesteps in ([900.0, 600.0, 300.0], [900.0, 600.0]):
            for step, t in enumerate(timesteps):
                for _ in range(2):
                    x = (torch.randn(5, 16, generator=generator) * t / 100).to(dtype)
                    model(x, timestep=torch.tensor([t]))
                    # (Running a and norm here records a's input again, the same x.)
                    for name, seen in (("a", x), ("b", model.norm(model.a(x)))):
                        old = expected[name].get(step)
                        expected[name][step] = (ranges_of(seen) if old is None
                                                else union(old, ranges_of(seen)))
    return model, calibration, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ranges_per_layer_and_step(dtype):
    model, calibration, expected = calibrated(dtype)
    assert calibration.steps == 3
    assert calibration.layers() == ["a", "b"]
    for name in ("a", "b"):
        ranges = calibration.ranges(name)
        assert ranges.dtype == torch.float32 and ranges.shape == (3, 2, model.get_submodule(
            name).in_features)
        for step in range(3):
            torch.testing.assert_close(ranges[step].double(), expected[name][step],
                                       rtol=0, atol=0)
    with pytest.raises(KeyError, match="'unused' never ran"):
        calibration.ranges("unused")
    # The hooks are gone after the with block: running again records nothing.
    model(torch.ones(1, 16, dtype=dtype), timestep=torch.tensor([1.0]))
    assert calibration.steps == 3


def test_calls_without_a_timestep_count_one_step_each():
    model = TwoLayers(torch.float32)
    with torch.no_grad(), ditops.calibrate(model) as calibration:
        for scale in (1.0, 2.0):
            model(torch.full((1, 16), scale))
        calibration.restart()
        model(torch.full((1, 16), 3.0))
    assert calibration.steps == 2
    assert calibration.ranges("a")[:, 0, 0].tolist() == [3.0, 2.0]


def static_params(ranges):
    """input_scale and input_offset of per-tensor ranges (float64; the range holds 0)."""
    high = max(ranges[0].max().item(), 0.0)
    low = min(ranges[1].min().item(), 0.0)
    scale = (high - low) / 255
    return scale, min(max(round(-128 - low / scale), -128), 127)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_timestep_export_holds_the_documented_tensors(tmp_path, dtype):
    model, calibration, expected = calibrated(dtype)
    report = calibration.export(tmp_path, algo="W8A8_TIMESTEP", keep_float=())
    assert report.quantized_layers == ["a", "b"]
    assert report.float_layers == {"table": "not an nn.Linear",
                                   "unused": "never ran while calibrating"}
    description = json.loads(open(report.description_path).read())
    assert description["model_quant_type"] == "W8A8_TIMESTEP"
    assert description["a.input_scale"] == "W8A8_TIMESTEP"
    assert description["table.weight"] == "FLOAT" and description["unused.weight"] == "FLOAT"
    files = load_file(report.weights_path)
    state = model.state_dict()
    for name in ("table.weight", "unused.weight", "unused.bias"):  # copied bit for bit
        assert files[name].dtype == dtype and torch.equal(files[name], state[name])
    for name in ("a", "b"):
        weight = state[f"{name}.weight"].double()
        scale = weight.abs().amax(1) / 127
        assert torch.equal(files[f"{name}.weight"],
                           torch.round(weight / scale[:, None]).to(torch.int8))
        torch.testing.assert_close(files[f"{name}.weight_scale"].double(), scale, rtol=1e-6,
                                   atol=0)
        assert torch.equal(files[f"{name}.weight_offset"], torch.zeros(weight.shape[0]))
        assert torch.equal(files[f"{name}.bias"], state[f"{name}.bias"].float())
        for step in range(3):
            input_scale, input_offset = static_params(expected[name][step])
            assert files[f"{name}.input_scale"][step].item() == pytest.approx(input_scale,
                                                                              rel=1e-6)
            assert files[f"{name}.input_offset"][step].item() == input_offset


def emulate_static(files, name, x, step):
    """The static layer from the file's tensors in float64: x_q = clamp(round(x / scale +
    offset)), y = scale * weight_scale * (x_q - offset) · W_qᵀ + bias."""
    scale = files[f"{name}.input_scale"][step].double()
    offset = files[f"{name}.input_offset"][step].double()
    q = torch.clamp(torch.round(x.double() / scale + offset), -128, 127) - offset
    weight = files[f"{name}.weight"].double() * files[f"{name}.weight_scale"].double()[:, None]
    return scale * q @ weight.T + files[f"{name}.bias"].double()


def test_timestep_export_loads_and_runs_each_steps_parameters(tmp_path):
    model, calibration, _ = calibrated(torch.float32)
    report = calibration.export(tmp_path, algo="W8A8_TIMESTEP", keep_float=())
    files = load_file(report.weights_path)
    policy = TimestepPolicyConfig()
    policy.register(range(0, 3), "static", target="w8a8_static_linear")
    quantized = quantize(TwoLayers(torch.float32), report.description_path,
                         timestep_config=policy)
    assert isinstance(quantized.a, ditops.QuantLinear) and quantized.a.layer.algo == "W8A8_TIMESTEP"
    assert isinstance(quantized.table, torch.nn.Embedding)
    x = torch.randn(7, 16, generator=torch.Generator().manual_seed(5)) * 6
    for step in range(3):
        ditops.set_timestep(quantized, step)
        y = quantized.a(x)
        # The kernels accumulate exactly in int32; what remains is fp32 rounding.
        torch.testing.assert_close(y.double(), emulate_static(files, "a", x, step), rtol=1e-5,
                                   atol=1e-5 * y.abs().max().item())


def test_static_smoothed_export_runs_close_to_the_float_flux(tmp_path):
    """A FLUX transformer calibrated on 3 steps: the W8A8 export with SmoothQuant (msmodelslim's
    div.mul_scale / .linear layout) and the W8A8_TIMESTEP export, loaded and run at a step
    calibrated on, stay within 0.5 % rel-L2 of the float model (measured about 0.07 %: the
    residual stream dominates the output; a wrong scale or offset anywhere gives tens of
    percent)."""
    model, inputs = models.flux()
    steps = [torch.tensor([t]) for t in (1.0, 0.6, 0.3)]
    with torch.no_grad():
        with ditops.calibrate(model) as calibration:
            for t in steps:
                model(**{**inputs, "timestep": t})
        expected = model(**{**inputs, "timestep": steps[1]})[0]
    static_dir, timestep_dir = tmp_path / "static", tmp_path / "timestep"
    static_dir.mkdir()
    timestep_dir.mkdir()
    static = calibration.export(static_dir, algo="W8A8", smooth=0.5)
    timestep = calibration.export(timestep_dir, algo="W8A8_TIMESTEP")
    assert "x_embedder" in static.float_layers and "proj_out" in static.float_layers
    assert any(name.endswith(".div.mul_scale") for name in load_file(static.weights_path))
    policy = TimestepPolicyConfig()
    policy.register(range(0, 3), "static", target="w8a8_static_linear")
    with torch.no_grad():
        for report, options in ((static, {}), (timestep, {"timestep_config": policy})):
            converted = quantize(models.flux()[0], report.description_path, **options)
            ditops.set_timestep(converted, 1)
            assert rel_l2(converted(**{**inputs, "timestep": steps[1]})[0], expected) < 0.005


def test_export_refuses_what_it_cannot_write(tmp_path):
    model = TwoLayers(torch.float32)
    with ditops.calibrate(model) as calibration:
        pass
    with pytest.raises(ditops.Error, match="no step was recorded"):
        calibration.export(tmp_path, algo="W8A8")
    with pytest.raises(ditops.Error, match="is not an existing directory"):
        calibration.export(tmp_path / "missing", algo="W8A8_DYNAMIC")
    with torch.no_grad(), ditops.calibrate(model) as calibration:
        model(torch.ones(2, 16), timestep=torch.tensor([1.0]))
    with pytest.raises(ditops.Error, match="algo \"W4A16\" is not W8A8"):
        calibration.export(tmp_path, algo="W4A16")
    with pytest.raises(ditops.Error, match="smooth alpha"):
        calibration.export(tmp_path, algo="W8A8_DYNAMIC", smooth=2.0)
    assert list(tmp_path.iterdir()) == []
    # Dynamic quantization without smoothing needs no ranges: the layer that never ran is
    # quantized too, unless keep_float names it.
    report = calibration.export(tmp_path, algo="W8A8_DYNAMIC", keep_float=())
    assert report.quantized_layers == ["a", "b", "unused"]
    report = calibration.export(tmp_path, algo="W8A8_DYNAMIC", keep_float=("unused",))
    assert report.quantized_layers == ["a", "b"] and report.float_layers == {
        "table": "not an nn.Linear", "unused": "keep_float"}


def test_a_whole_wan_pipeline_calibrates_one_step_per_denoising_step(tmp_path):
    """WanPipeline with classifier-free guidance calls the transformer twice per step (the
    two calls share a step); the W8A8_TIMESTEP export then holds one parameter pair per
    step."""
    pytest.importorskip("transformers")
    pipe = models.wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    calls = []
    pipe.transformer.register_forward_pre_hook(lambda module, args: calls.append(1))
    with torch.inference_mode(), ditops.calibrate(pipe.transformer) as calibration:
        pipe("a red fox in the snow", negative_prompt="blurry", num_inference_steps=3,
             guidance_scale=5.0, max_sequence_length=16, height=64, width=64, num_frames=5,
             generator=torch.Generator().manual_seed(0), output_type="latent")
    assert len(calls) == 6 and calibration.steps == 3
    report = calibration.export(tmp_path, algo="W8A8_TIMESTEP")
    files = load_file(report.weights_path)
    name = report.quantized_layers[0]
    assert files[f"{name}.input_scale"].shape == (3,)
