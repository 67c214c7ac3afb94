"""ditops.mindiesd.quantization against MindIE-SD 3.1.0's definitions: quantize() with an
OnlineQuantConfig (a model's own nn.Linear layers as W8A8_DYNAMIC layers, in memory) against
the float layers and float64 math, on a small FLUX transformer end to end, with fallback layers
kept as they were; TimestepPolicyConfig and the global TimestepManager as MindIE-SD defines
them, driving the W8A8_TIMESTEP export of tests/fixtures/msmodelslim; QuantConfig and
OnlineQuantConfig validation; refused algorithms naming themselves with nothing replaced."""

import contextvars
import json

import pytest
import torch
from safetensors.torch import load_file

import ditops
import models
from ditops.mindiesd._unsupported import FeatureNotSupported
from ditops.mindiesd.quantization import (
    OnlineQuantConfig,
    QuantConfig,
    TimestepManager,
    TimestepPolicyConfig,
    quantize,
)
from ditops.mindiesd.quantization.mode import QuantAlgorithm
from ditops.mindiesd.utils.exception import ConfigError, ModelInitError, ParametersInvalid
from test_quant import FIXTURES, TIMESTEP, TIMESTEP_LAYERS, W8A8, check, model_with, on_grid


@pytest.fixture(autouse=True)
def no_timestep_left_set():
    """TimestepManager's values live in the test thread's context: each test starts and ends
    without a step or a largest step."""
    TimestepManager.set_timestep_idx_max(None)
    TimestepManager.set_timestep_idx(None)
    yield
    TimestepManager.set_timestep_idx_max(None)
    TimestepManager.set_timestep_idx(None)


def linears(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def quantized(model):
    return {name for name, m in model.named_modules() if isinstance(m, ditops.QuantLinear)}


def rel_l2(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


# --- online quantization --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_online_layer_is_exact_where_int8_is(dtype):
    """Per-output-channel weights and per-token activations, symmetric int8 with scale
    max|row| / 127: on weights and inputs that lie on those grids (scales powers of two)
    nothing is lost, so y is the float64 x·Wᵀ + b after one fp32 rounding of the bias sum (the
    integer sums are exact), and for bf16 one bf16 rounding of y (2^-8 relative). Per-tensor
    scales would miss by at least one grid step (>= 2^-12 here). float32 weights are given 0.3
    of a step below the grid (but the row maxima): rounding to nearest takes them back to it
    (bfloat16 has no room for that)."""
    generator = torch.Generator().manual_seed(1)
    layer = torch.nn.Linear(40, 24).to(dtype)
    weight, scales = on_grid(24, 40, generator)
    layer.weight.data.copy_(weight)
    if dtype == torch.float32:
        layer.weight.data[:, 1:] -= 0.3 * scales[:, None]
    x, _ = on_grid(7, 40, generator)
    x = x.to(dtype).reshape(7, 1, 40)  # a 3-D input keeps its leading shape
    model = quantize(torch.nn.Sequential(layer), online_config=OnlineQuantConfig())
    y = model(x)
    assert isinstance(model[0], ditops.QuantLinear) and y.dtype == dtype and y.shape == (7, 1, 24)
    product = x.double() @ weight.double().T
    want = product + layer.bias.double()
    bound = 2.0**-23 * (product.abs() + want.abs())
    if dtype == torch.bfloat16:
        bound += 2.0**-8 * want.abs()
    assert torch.all((y.double() - want).abs() <= bound)


def test_online_layer_within_the_int8_bound_of_the_float_layer():
    """Random weights and inputs against the float layer: each weight is off by at most
    s_w / 2 (s_w = max|W_n| / 127) and each input by at most s_x / 2 (s_x = max|x_m| / 127),
    so |y - x·Wᵀ - b| <= s_w/2 · Σ|x| + s_x/2 · Σ|W_n| + K · s_x s_w / 4, plus the fp32
    epilogue (2^-22 relative); float16 x is computed in float32 and rounded (2^-11)."""
    torch.manual_seed(2)
    layer = torch.nn.Linear(96, 40)
    x = torch.randn(9, 96) * torch.rand(9, 1) * 4
    x[:, 5] *= 30  # an outlier channel widens s_x
    w = layer.weight.detach().double()
    s_w = w.abs().amax(1) / 127
    s_x = x.double().abs().amax(1, keepdim=True) / 127
    want = x.double() @ w.T + layer.bias.double()
    bound = (s_w / 2 * x.double().abs().sum(1, keepdim=True) + s_x / 2 * w.abs().sum(1)
             + 96 * s_x * s_w / 4 + 2.0**-22 * want.abs())
    model = quantize(torch.nn.Sequential(layer), online_config=OnlineQuantConfig())
    error = (model(x).double() - want).abs()
    assert torch.all(error <= bound)
    assert error.max() > 0  # the layer did quantize
    half = model(x.half()).double()
    assert torch.all((half - want).abs() <= bound + 2.0**-11 * want.abs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_online_flux_end_to_end(dtype):
    """Every nn.Linear of a small FLUX transformer becomes a W8A8_DYNAMIC layer and the output
    stays within 3 % rel-L2 of the float model's (each layer adds about 1 %: two int8
    roundings of step max/127 at about 0.7 % RMS each for Gaussian rows; a wrong layer gives
    O(1)); bfloat16 in, bfloat16 out; also with ditops.diffusers.enable."""
    import ditops.diffusers

    model, inputs = models.flux(dtype=dtype, height=8, width=8, head_dim=32)
    reference = model(**inputs)[0]
    names = set(linears(model))
    assert quantize(model, online_config=OnlineQuantConfig()) is model
    assert not linears(model) and quantized(model) == names
    assert all(model.get_submodule(n).layer.algo == "W8A8_DYNAMIC" for n in names)
    out = model(**inputs)[0]
    assert out.dtype == dtype
    assert rel_l2(out, reference) < 0.03
    ditops.diffusers.enable(model)
    try:
        assert rel_l2(model(**inputs)[0], reference) < 0.03
    finally:
        ditops.diffusers.disable(model)


def test_online_fallback_layers():
    """fallback_layers: W16A16 keeps the layer (the same module, its weights untouched); W8A8
    is the same online W8A8 layer; names match exactly, as shell patterns or with {a,b}."""
    model, _ = models.flux(height=8, width=8, head_dim=32)
    before = linears(model)
    weights = {name: m.weight.clone() for name, m in before.items()}
    config = OnlineQuantConfig(fallback_layers={
        "transformer_blocks.*.ff.net.*": QuantAlgorithm.W16A16,
        "{proj_out,norm_out.linear}": "w16a16",
        "x_embedder": "W16A16",
        "context_embedder": QuantAlgorithm.W8A8,
    })
    quantize(model, online_config=config)
    kept = {"transformer_blocks.0.ff.net.0.proj", "transformer_blocks.0.ff.net.2", "proj_out",
            "norm_out.linear", "x_embedder"}
    after = linears(model)
    assert set(after) == kept
    for name in kept:
        assert after[name] is before[name] and torch.equal(after[name].weight, weights[name])
    assert quantized(model) == set(before) - kept
    assert "context_embedder" in quantized(model)


@pytest.mark.parametrize("config", [
    OnlineQuantConfig(quant_type="W4A4_MXFP4"),
    OnlineQuantConfig(quant_type=QuantAlgorithm.W4A4_MXFP4_DUALSCALE),
    OnlineQuantConfig(quant_type=QuantAlgorithm.W8A8_MXFP8),
    OnlineQuantConfig(fa_layers=("attn",), fa_quant_type="FP8_DYNAMIC"),
    OnlineQuantConfig(fa_layers="Attention", fa_quant_type=QuantAlgorithm.MXFP4_DYNAMIC),
], ids=["W4A4_MXFP4", "W4A4_MXFP4_DUALSCALE", "W8A8_MXFP8", "FP8_DYNAMIC", "MXFP4_DYNAMIC"])
def test_online_algorithms_ditops_cannot_run_name_themselves(config):
    model, _ = models.flux(height=8, width=8, head_dim=32)
    before = linears(model)
    algorithm = config.fa_quant_type or config.quant_type
    with pytest.raises(FeatureNotSupported, match=algorithm.value) as error:
        quantize(model, online_config=config)
    assert isinstance(error.value, ParametersInvalid)
    assert linears(model) == before and not quantized(model)


def test_online_refuses_a_layer_it_cannot_quantize_and_replaces_nothing():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    with torch.no_grad():
        model[1].weight[2, 3] = float("inf")
    with pytest.raises(ParametersInvalid, match='layer "1"'):
        quantize(model, online_config=OnlineQuantConfig())
    assert not quantized(model)


def test_quantize_arguments():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    online = OnlineQuantConfig()
    for call in (
        lambda: quantize(torch.zeros(3), online_config=online),
        lambda: quantize(model, str(W8A8), online_config=online),
        lambda: quantize(model, online_config=online, quant_config=QuantConfig()),
        lambda: quantize(model, online_config={"quant_type": "W8A8_DYNAMIC"}),
        lambda: quantize(model, online_config=online, dtype=torch.float32),
        lambda: quantize(model, str(W8A8), dtype="bfloat16"),
        lambda: quantize(model, str(W8A8), quant_config={"quant_des_path": str(W8A8)}),
        lambda: quantize(model, str(W8A8), timestep_config="static"),
        lambda: quantize(model, str(W8A8), timestep_policy=[0, 1]),
        lambda: quantize(model, str(W8A8), timestep_config=TimestepPolicyConfig(),
                         timestep_policy=TimestepPolicyConfig()),
        lambda: quantize(model, str(FIXTURES / "missing.json")),
    ):
        with pytest.raises(ParametersInvalid):
            call()
    for path in (None, "", "  ", 3):
        with pytest.raises(ConfigError):
            quantize(model, path)
    with pytest.raises(ModelInitError):
        quantize(model, str(W8A8), use_nz="yes")
    assert not quantized(model)


# --- exports --------------------------------------------------------------------------------

BLOCK = "transformer_blocks.0."
W8A8_LAYERS = [BLOCK + n for n in ("attn.to_q", "attn.to_k", "attn.to_v", "ff.net.0.proj")]


def test_export_with_quant_config():
    """QuantConfig carries the path; its exclude_layers keep layers, its quantized_layers
    choose them; the caller's config is not modified; use_nz and dtype are accepted."""
    config = QuantConfig(quant_des_path=str(W8A8), exclude_layers=[BLOCK + "attn.to_q"])
    model = quantize(model_with(W8A8_LAYERS, 37, 19), quant_config=config, use_nz=True,
                     dtype=torch.float16)
    assert quantized(model) == set(W8A8_LAYERS[1:])
    assert config.use_nz is None and config.timestep_config is None
    chosen = QuantConfig(quant_des_path=str(W8A8), quantized_layers={
        BLOCK + "attn.to_v": {"quant_algo": "W8A8_DYNAMIC"}})
    model = quantize(model_with(W8A8_LAYERS, 37, 19), quant_config=chosen)
    assert quantized(model) == {BLOCK + "attn.to_v"}
    # A path argument wins over the config's.
    model = quantize(model_with(W8A8_LAYERS, 37, 19), str(W8A8),
                     quant_config=QuantConfig(quant_des_path=str(FIXTURES / "none.json")))
    assert quantized(model) == set(W8A8_LAYERS)


def test_export_algorithms_ditops_cannot_run_name_themselves(tmp_path):
    described = json.loads(W8A8.read_text())
    described[BLOCK + "ff.net.0.proj.weight"] = "W4A16"
    path = tmp_path / W8A8.name
    path.write_text(json.dumps(described))
    model = model_with(W8A8_LAYERS, 37, 19)
    with pytest.raises(FeatureNotSupported, match="W4A16"):
        quantize(model, str(path))
    for algorithm in ("W4A4_DYNAMIC", "W8A16"):
        with pytest.raises(FeatureNotSupported, match=algorithm):
            quantize(model, quant_config=QuantConfig(quant_des_path=str(W8A8),
                                                     quant_algo=algorithm))
    # Another runnable algorithm than the export's tensors are for: refused, naming both.
    with pytest.raises(ParametersInvalid, match="W8A8_TIMESTEP"):
        quantize(model, quant_config=QuantConfig(quant_des_path=str(W8A8),
                                                 quant_algo="W8A8_TIMESTEP"))
    assert not quantized(model)


def test_multi_card_description_is_this_ranks(monkeypatch):
    """A description named ..._<n>.json stands for the rank's own: torch.distributed must be
    initialized, and its rank picks the file."""
    description = FIXTURES / "w8a8_dynamic" / "quant_model_description_w8a8_dynamic_0.json"
    expected = load_file(str(description.parent / "expected.safetensors"))
    layer = BLOCK + "attn.to_q"
    with pytest.raises(ConfigError, match="distributed"):
        quantize(model_with([layer], 37, 10), str(description))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    rank_1 = description.with_name("quant_model_description_w8a8_dynamic_1.json")
    out_features = expected[f"{rank_1.name}:{layer}:y"].shape[-1]
    model = quantize(model_with([layer], 37, out_features), str(description))
    check(model.get_submodule(layer), expected["x"], expected, f"{rank_1.name}:{layer}")


# --- timestep policy and manager ------------------------------------------------------------

def test_timestep_policy_config():
    policy = TimestepPolicyConfig()
    assert [policy.get_strategy(3, target) for target in ("w8a8_static_linear", "w4a4_linear",
                                                          "fa")] == ["dynamic", "W4A4", "MXFP4"]
    assert policy.get_strategy(None) == "W4A4"  # the default target is w4a4_linear
    policy.register(range(2, 5), "W4A8")
    policy.register([4], "W4A4")  # a later registration wins
    assert [policy.get_strategy(s) for s in range(6)] == ["W4A4", "W4A4", "W4A8", "W4A8",
                                                          "W4A4", "W4A4"]
    policy.register(1, "static", target="linear")  # "linear": whichever target has it
    policy.register(1, "FLOAT", target="fa")
    assert policy.get_strategy(1, "w8a8_static_linear") == "static"
    assert policy.get_strategy(1, "fa") == "FLOAT" and policy.get_strategy(1) == "W4A4"
    static = TimestepPolicyConfig(default_strategy="static", fa_default_strategy="FP8")
    static.register([0, 3], "dynamic", target="w8a8_static_linear")
    assert [static.get_strategy(s, "w8a8_static_linear") for s in range(4)] == [
        "dynamic", "static", "static", "dynamic"]
    assert static.get_strategy(7, "fa") == "FP8"
    for bad in (lambda: policy.register(1, "static"),  # not a w4a4_linear strategy
                lambda: policy.register(1, "W4A4", target="attention"),
                lambda: policy.register(1, "sometimes", target="linear"),
                lambda: TimestepPolicyConfig(default_strategy="W4A4"),
                lambda: policy.get_strategy(1, target="linear")):
        with pytest.raises(ValueError):
            bad()
    for bad in (lambda: policy.register(1.0, "W4A4"), lambda: policy.register((1, 2), "W4A4"),
                lambda: policy.register([1, "2"], "W4A4"), lambda: policy.register(1, 4),
                lambda: policy.register(1, "W4A4", target=3),
                lambda: TimestepPolicyConfig(fa_default_strategy=None)):
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(ParametersInvalid):
        policy.get_strategy("1")


def test_timestep_manager_values():
    def fresh():
        assert TimestepManager.get_timestep_idx() is None
        assert TimestepManager.get_timestep_idx_max() is None
        TimestepManager.set_timestep_idx(7)

    TimestepManager.set_timestep_idx_max(4)
    TimestepManager.set_timestep_idx(4)  # at most the largest step
    contextvars.Context().run(fresh)  # the values are per context
    assert TimestepManager.get_timestep_idx() == 4 and TimestepManager.get_timestep_idx_max() == 4
    for bad in (lambda: TimestepManager.set_timestep_idx(5),
                lambda: TimestepManager.set_timestep_idx(-1),
                lambda: TimestepManager.set_timestep_idx(1.0),
                lambda: TimestepManager.set_timestep_idx_max("4")):
        with pytest.raises(ParametersInvalid):
            bad()
    assert TimestepManager.get_timestep_idx() == 4 and TimestepManager.get_timestep_idx_max() == 4
    TimestepManager.set_timestep_idx(None)
    assert TimestepManager.get_timestep_idx() is None


def test_timestep_manager_moves_every_quantized_model():
    """The fixture's outputs assume steps 0 and 2 static, every other step dynamic. Here the
    policy's default is static and 1, 3 are registered dynamic (the fixture's 4 and 5: past
    the layers' 4 steps, dynamic whatever the policy); no step set is dynamic."""
    expected = load_file(str(TIMESTEP.parent / "expected.safetensors"))
    policy = TimestepPolicyConfig(default_strategy="static")
    policy.register([1, 3], "dynamic", target="w8a8_static_linear")
    TimestepManager.set_timestep_idx(1)
    first = quantize(model_with(TIMESTEP_LAYERS, 37, 19), str(TIMESTEP),
                     quant_config=QuantConfig(timestep_config=policy))
    second = quantize(model_with(TIMESTEP_LAYERS, 37, 19), str(TIMESTEP), timestep_policy=policy)
    assert TimestepManager.get_timestep_idx_max() == 4
    x = expected["x"]

    def outputs_at(step, models):
        for model in models:
            for name in TIMESTEP_LAYERS:
                check(model.get_submodule(name), x, expected, f"{TIMESTEP.name}:{name}@{step}")

    outputs_at(1, [first, second])  # converted at the step already set
    for step in (2, 0, 3, 4):
        TimestepManager.set_timestep_idx(step)
        outputs_at(step, [first, second])
    ditops.set_timestep(first, 2)  # one model only
    outputs_at(2, [first])
    outputs_at(4, [second])
    TimestepManager.set_timestep_idx(None)
    outputs_at(1, [first, second])
    # The policy is read at each step, as MindIE-SD's layers read it at each forward.
    policy.register(1, "static", target="w8a8_static_linear")
    policy.register(0, "dynamic", target="w8a8_static_linear")
    TimestepManager.set_timestep_idx(0)
    outputs_at(1, [first, second])  # dynamic, as the fixture's step 1


# --- configurations -------------------------------------------------------------------------

def test_quant_config_fields():
    config = QuantConfig(quant_algo="w8a8_dynamic", exclude_layers=["a", "b"],
                         quantized_layers={"x": {"quant_algo": "W8A8"}})
    assert config.quant_algo is QuantAlgorithm.W8A8_DYNAMIC
    assert config.exclude_layers == ("a", "b") and config.dtype is torch.bfloat16
    assert config.quantized_layers["x"].quant_algo is QuantAlgorithm.W8A8
    assert config.quant_algorithms_list == [QuantAlgorithm.W8A8]
    merged = QuantConfig(quant_algo="W8A8", quantized_layers={"x": QuantConfig(
        quant_algo="W8A8")}).merged_with_user(QuantConfig(quant_algo="W8A8_TIMESTEP"))
    assert merged.quantized_layers["x"].quant_algo is QuantAlgorithm.W8A8_TIMESTEP
    assert QuantConfig.from_kwargs({"use_nz": True, "timestep_policy": None}).use_nz is True
    assert config.to_kwargs()["quant_config"] is config
    for fields in (dict(quant_algo="W9A9"), dict(quant_algo=8), dict(exclude_layers="a"),
                   dict(exclude_layers=(1,)), dict(quantized_layers=[]),
                   dict(quantized_layers={"x": 1}), dict(quant_des_path=3),
                   dict(dtype=torch.float32), dict(use_nz=1), dict(timestep_config="static"),
                   dict(mxfp4_scale_alg=1.5), dict(mxfp4_dst_type_max=True)):
        with pytest.raises(ModelInitError):
            QuantConfig(**fields)


def test_online_quant_config_fields():
    config = OnlineQuantConfig()
    assert config.quant_type is QuantAlgorithm.W8A8_DYNAMIC
    assert (config.fallback_layers, config.fa_layers, config.fa_quant_type) == ({}, (), None)
    config = OnlineQuantConfig(fallback_layers={"a*": "w8a8"}, fa_layers=["attn"],
                               fa_quant_type="fp8_dynamic", mxfp4_dst_type_max=6)
    assert config.fallback_layers == {"a*": QuantAlgorithm.W8A8}
    assert config.mxfp4_dst_type_max == 6.0 and isinstance(config.mxfp4_dst_type_max, float)
    serialized = config.serialize_to_dict()
    assert serialized == {"quant_type": "W8A8_DYNAMIC", "fallback_layers": {"a*": "W8A8"},
                          "fa_quant_type": "FP8_DYNAMIC", "fa_layers": ["attn"]}
    assert OnlineQuantConfig.parse_from_dict(serialized).serialize_to_dict() == serialized
    for fields in (dict(quant_type="W8A8"), dict(quant_type="W9"), dict(fallback_timesteps=[1]),
                   dict(fallback_layers={"a": "W4A4_DYNAMIC"}), dict(fallback_layers=["a"]),
                   dict(fallback_layers={1: "W8A8"}), dict(fa_quant_type="FP8_DYNAMIC"),
                   dict(fa_layers=["a"], fa_quant_type="W8A8"), dict(fa_layers=3),
                   dict(timestep_config=1), dict(mxfp4_scale_alg="2")):
        with pytest.raises(ModelInitError):
            OnlineQuantConfig(**fields)

