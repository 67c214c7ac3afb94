"""ditops.quantize on the msmodelslim exports of tests/fixtures/msmodelslim (written with the
reference safetensors package, outputs computed there with numpy): a torch model with the
exported layers' names gets them as ditops layers, which give the fixture's outputs within the
bound it states, at every denoising step of the W8A8_TIMESTEP export under the policy
TimestepPolicyConfig sets."""

import pathlib

import pytest
import torch
from safetensors.torch import load_file

import ditops

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "msmodelslim"


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
    expected = load_file(str(FIXTURES / "w8a8" / "expected.safetensors"))
    description = FIXTURES / "w8a8" / "quant_model_description_w8a8.json"
    block = "transformer_blocks.0."
    quantized = [block + n for n in ("attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj")]
    kept = [block + "attn.to_out.0"]  # FLOAT in the export: the model keeps its own
    model = ditops.quantize(model_with(quantized + kept, 37, 19), description)
    assert model._ditops_quantized_layers == 4
    assert isinstance(model.get_submodule(kept[0]), torch.nn.Linear)
    x = expected["x"]
    for name in quantized:
        layer = model.get_submodule(name)
        assert isinstance(layer, ditops.QuantLinear)
        check(layer, x, expected, f"{description.name}:{name}")


def test_timestep_policy_and_steps():
    expected = load_file(str(FIXTURES / "w8a8_timestep" / "expected.safetensors"))
    description = FIXTURES / "w8a8_timestep" / "quant_model_description_w8a8_timestep.json"
    static_steps = expected[f"{description.name}:static_steps"].tolist()
    policy = ditops.TimestepPolicyConfig().register(range(0, 4), "static")
    policy.register([s for s in range(4) if s not in static_steps], "dynamic")
    names = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k"]
    model = ditops.quantize(model_with(names, 37, 19), description, timestep_config=policy)
    other = ditops.quantize(model_with(names, 37, 19), description, timestep_config=policy)
    x = expected["x"]
    for step in (1, 0, 3, 2, 5):
        ditops.set_timestep(model, step)
        ditops.set_timestep(other, 4)  # another model's step does not move this one's
        for name in names:
            check(model.get_submodule(name), x, expected, f"{description.name}:{name}@{step}")
    with pytest.raises(ValueError):
        ditops.TimestepPolicyConfig().register(3, "sometimes")


def test_mismatched_layer_shapes_are_refused():
    description = FIXTURES / "w8a8" / "quant_model_description_w8a8.json"
    model = model_with(["transformer_blocks.0.attn.to_q"], 36, 19)
    with pytest.raises(ValueError, match="transformer_blocks.0.attn.to_q"):
        ditops.quantize(model, description)
    assert isinstance(model.get_submodule("transformer_blocks.0.attn.to_q"), torch.nn.Linear)
