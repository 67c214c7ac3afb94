"""ditops' W8A8 layers in torch models: ditops.quantize on the msmodelslim exports of
tests/fixtures/msmodelslim (written with the reference safetensors package, outputs computed
there with numpy), which give the fixture's outputs within the bound it states at every
denoising step of the W8A8_TIMESTEP export, one model's step apart from another's
(ditops.set_timestep); and the layers the C++ module builds from tensors in memory
(QuantLinear.w8a8, QuantLinear.float_linear) against float64 math, on inputs whose
quantization is exact so that only the fp32 epilogue rounds."""

import pathlib

import pytest
import torch
from safetensors.torch import load_file

import ditops
from ditops import _ditops

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "msmodelslim"
W8A8 = FIXTURES / "w8a8" / "quant_model_description_w8a8.json"
TIMESTEP = FIXTURES / "w8a8_timestep" / "quant_model_description_w8a8_timestep.json"
TIMESTEP_LAYERS = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k"]


def model_with(names, in_features, out_features):
    """A module tree holding an nn.Linear at each dotted name."""
    root = torch.nn.Module()
    for name in names:
        parent = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, torch.nn.Linear(in_features, out_features))
    return root


def check(layer, x, expected, key):
    y = layer(x).double()
    want, bound = expected[key + ":y"], expected[key + ":bound"]
    assert torch.all((y - want).abs() <= bound), f"{key}: {(y - want).abs().max()}"


def test_quantize_gives_the_exports_outputs():
    expected = load_file(str(W8A8.parent / "expected.safetensors"))
    block = "transformer_blocks.0."
    quantized = [block + n for n in ("attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj")]
    kept = [block + "attn.to_out.0"]  # FLOAT in the export: the model keeps its own
    model = model_with(quantized + kept, 37, 19)
    own = model.get_submodule(kept[0])
    assert ditops.quantize(model, str(W8A8)) is model
    assert model.get_submodule(kept[0]) is own
    x = expected["x"]
    for name in quantized:
        layer = model.get_submodule(name)
        assert isinstance(layer, ditops.QuantLinear)
        check(layer, x, expected, f"{W8A8.name}:{name}")


def test_timestep_policy_and_per_model_steps():
    expected = load_file(str(TIMESTEP.parent / "expected.safetensors"))
    static_steps = expected[f"{TIMESTEP.name}:static_steps"].tolist()
    policy = ditops.TimestepPolicyConfig()
    policy.register(static_steps, "static", target="w8a8_static_linear")
    model = ditops.quantize(model_with(TIMESTEP_LAYERS, 37, 19), str(TIMESTEP),
                            timestep_config=policy)
    other = ditops.quantize(model_with(TIMESTEP_LAYERS, 37, 19), str(TIMESTEP),
                            timestep_config=policy)
    x = expected["x"]
    for step in (1, 0, 3, 2, 5):
        ditops.set_timestep(model, step)
        ditops.set_timestep(other, 4)  # another model's step does not move this one's
        for name in TIMESTEP_LAYERS:
            check(model.get_submodule(name), x, expected, f"{TIMESTEP.name}:{name}@{step}")
    with pytest.raises(ValueError):
        ditops.set_timestep(model, -1)
    with pytest.raises(ValueError, match="not converted"):
        ditops.set_timestep(torch.nn.Linear(2, 2), 0)


def test_mismatched_layer_shapes_are_refused():
    model = model_with(["transformer_blocks.0.attn.to_q"], 36, 19)
    with pytest.raises(ValueError, match="transformer_blocks.0.attn.to_q"):
        ditops.quantize(model, str(W8A8))
    assert type(model.get_submodule("transformer_blocks.0.attn.to_q")) is torch.nn.Linear


def on_grid(rows, cols, generator):
    """[rows, cols] float32 values j · 2^-e_r (j integer in [-126, 126], e_r from 3 to 6 by
    row) whose first column is 127 · 2^-e_r: per-row symmetric int8 quantization takes each
    row exactly (scale 2^-e_r, x_q = j). Returns the values and the scales."""
    scales = 2.0 ** -(3 + torch.arange(rows) % 4)
    levels = torch.randint(-126, 127, (rows, cols), generator=generator)
    levels[:, 0] = 127
    return (levels * scales[:, None]).float(), scales.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_from_tensors_in_memory(dtype):
    """W8A8_DYNAMIC, W8A8 (static) and FLOAT layers built from tensors, on x whose
    quantization is exact: y is the float64 x·Wᵀ + b after one fp32 rounding of each product
    and of the bias sum (the integer sums are exact: |Σ| < 2^24), and for bf16 x one bf16
    rounding of y (2^-8 relative)."""
    generator = torch.Generator().manual_seed(0)
    rows, in_features, out_features = 5, 40, 24
    x, _ = on_grid(rows, in_features, generator)
    weight, weight_scale = on_grid(out_features, in_features, generator)
    weight_q = torch.round(weight / weight_scale[:, None]).to(torch.int8)
    bias = torch.randn(out_features, generator=generator)
    # Static: one scale for the tensor (2^-6 divides every row's step) and an integer offset.
    input_scale, input_offset = torch.tensor([2.0**-6]), torch.tensor([3.0])
    levels = torch.round(x.double() / input_scale.double())
    static_x = (torch.clamp(levels + input_offset, -128, 127) - input_offset) * input_scale
    quant_bias = (-input_offset * weight_q.double().sum(1)).to(torch.int32)
    deq_scale = (input_scale * weight_scale).float()
    layers = {
        "W8A8_DYNAMIC": (_ditops.QuantLinear.w8a8("W8A8_DYNAMIC", weight_q,
                                                  weight_scale=weight_scale, bias=bias), x),
        "W8A8": (_ditops.QuantLinear.w8a8(
            "W8A8", weight_q, deq_scale=deq_scale, quant_bias=quant_bias,
            input_scale=input_scale, input_offset=input_offset, bias=bias), static_x),
        "FLOAT": (_ditops.QuantLinear.float_linear(weight, bias), x),
    }
    for algo, (layer, seen_x) in layers.items():
        module = ditops.QuantLinear(layer, algo)
        assert (layer.algo, module.in_features, module.out_features) == (algo, 40, 24)
        y = module(x.to(dtype))
        assert y.dtype == dtype and y.shape == (rows, out_features)
        product = seen_x.double() @ weight.double().T
        want = product + bias.double()
        bound = 2.0**-23 * (product.abs() + bias.double().abs() + want.abs())
        if dtype == torch.bfloat16:
            bound += 2.0**-8 * want.abs()
        assert torch.all((y.double() - want).abs() <= bound), algo


def test_layers_from_tensors_refuse_bad_tensors():
    weight = torch.ones(4, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="W8A8_TIMESTEP"):
        _ditops.QuantLinear.w8a8("W8A8_TIMESTEP", weight, weight_scale=torch.ones(4))
    with pytest.raises(ValueError, match="weight_scale"):
        _ditops.QuantLinear.w8a8("W8A8_DYNAMIC", weight, weight_scale=torch.ones(3))
    with pytest.raises(ValueError, match="weight_scale"):
        _ditops.QuantLinear.w8a8("W8A8_DYNAMIC", weight,
                                 weight_scale=torch.tensor([1.0, 1.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="weight"):
        _ditops.QuantLinear.float_linear(torch.ones(4, dtype=torch.float32))
