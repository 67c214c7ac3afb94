"""ditops.mindiesd's layernorm_scale_shift and fast_layernorm against torch float64 math written
from MindIE-SD's documented semantics (LayerNorm over the last dimensions, then · (1 + scale) +
shift), for every scale/shift form and dtype; fused=False against MindIE-SD's own torch formula,
bit for bit; MindIE-SD's argument checks (ParametersInvalid); and torch.compile."""

import re

import pytest
import torch

import ditops
from ditops.mindiesd import fast_layernorm, layernorm_scale_shift
from ditops.mindiesd.utils.exception import ParametersInvalid
from conftest import close

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference_layer_norm(x, weight, bias, eps, dims=1):
    """LayerNorm over the last `dims` dimensions in float64 (biased variance)."""
    x = x.double()
    axes = tuple(range(-dims, 0))
    mean = x.mean(axes, keepdim=True)
    variance = ((x - mean) ** 2).mean(axes, keepdim=True)
    y = (x - mean) / torch.sqrt(variance + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def reference_modulated(layernorm, x, scale, shift):
    """layernorm(x) · (1 + scale) + shift in float64; [B, H] scale/shift act per batch element."""
    scale = scale[:, None] if scale.dim() == 2 else scale
    shift = shift[:, None] if shift.dim() == 2 else shift
    y = reference_layer_norm(x, layernorm.weight, layernorm.bias, layernorm.eps)
    return y * (1 + scale.double()) + shift.double()


def randn(*shape, dtype=torch.float32, mean=0.0, std=1.0):
    return (torch.randn(*shape) * std + mean).to(dtype)


def layer_norm_module(hidden, dtype, affine="random"):
    """A LayerNorm of `hidden` channels: affine "random" (weight ~ N(1, 0.5), bias ~ N(0, 0.5)),
    "none" (elementwise_affine=False) or "no_bias" (bias=False); parameters in `dtype`."""
    norm = torch.nn.LayerNorm(hidden, eps=1e-5, elementwise_affine=affine != "none",
                              bias=affine != "no_bias")
    with torch.no_grad():  # also where tests are collected, outside the no_grad fixture
        if norm.weight is not None:
            norm.weight.copy_(randn(hidden, mean=1.0, std=0.5))
        if norm.bias is not None:
            norm.bias.copy_(randn(hidden, std=0.5))
    return norm.to(dtype)


def modulation(form, batch, seq, hidden, dtype):
    """scale or shift of MindIE-SD's forms: "BH" [B, H], "B1H" [B, 1, H], "BSH" [B, S, H]."""
    shape = {"BH": (batch, hidden), "B1H": (batch, 1, hidden), "BSH": (batch, seq, hidden)}[form]
    return randn(*shape, dtype=dtype, std=0.5)


FORMS = [("BH", "BH"), ("B1H", "B1H"), ("BSH", "BSH"), ("BH", "BSH"), ("BSH", "B1H")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("forms", FORMS, ids="-".join)
@pytest.mark.parametrize("hidden", [1, 17, 128])
def test_layernorm_scale_shift_matches_float64(dtype, forms, hidden):
    batch, seq = 2, 5
    norm = layer_norm_module(hidden, torch.float32)
    x = randn(batch, seq, hidden, dtype=dtype, mean=0.3, std=1.5)
    scale = modulation(forms[0], batch, seq, hidden, dtype)
    shift = modulation(forms[1], batch, seq, hidden, dtype)
    out = layernorm_scale_shift(norm, x, scale, shift)
    assert out.dtype == dtype and out.shape == x.shape
    close(out, reference_modulated(norm, x, scale, shift))


@pytest.mark.parametrize("affine", ["random", "none", "no_bias"])
@pytest.mark.parametrize("parameter_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("modulation_dtype", [torch.float32, torch.bfloat16, "mixed"], ids=str)
def test_parameter_and_modulation_dtypes(affine, parameter_dtype, modulation_dtype, threads):
    # bfloat16 x with a LayerNorm kept in float32 or cast to bfloat16, and scale/shift in
    # float32, in bfloat16 or one of each; FLUX's width, rows enough for two threads.
    batch, seq, hidden = 2, 48, 3072
    norm = layer_norm_module(hidden, parameter_dtype, affine)
    x = randn(batch, seq, hidden, dtype=torch.bfloat16, mean=0.3, std=1.5)
    scale_dtype = torch.float32 if modulation_dtype == "mixed" else modulation_dtype
    shift_dtype = torch.bfloat16 if modulation_dtype == "mixed" else modulation_dtype
    scale = modulation("BH", batch, seq, hidden, scale_dtype)
    shift = modulation("BSH", batch, seq, hidden, shift_dtype)
    out = layernorm_scale_shift(norm, x, scale, shift)
    assert out.dtype == torch.bfloat16
    close(out, reference_modulated(norm, x, scale, shift))


def test_modulation_slices_of_one_projection():
    # AdaLN-Zero's scale and shift are chunks of one linear output: [B, H] views whose batch
    # stride is 6H, not H.
    hidden = 64
    norm = layer_norm_module(hidden, torch.float32, "none")
    x = randn(3, 7, hidden)
    shift, scale, *_ = randn(3, 6 * hidden).chunk(6, dim=1)
    close(layernorm_scale_shift(norm, x, scale, shift), reference_modulated(norm, x, scale, shift))


@pytest.mark.parametrize("forms", FORMS, ids="-".join)
def test_unfused_is_mindiesd_torch_formula(forms):
    norm = layer_norm_module(32, torch.float32)
    x = randn(2, 4, 32, dtype=torch.bfloat16)
    scale = modulation(forms[0], 2, 4, 32, torch.bfloat16)
    shift = modulation(forms[1], 2, 4, 32, torch.bfloat16)
    want = norm(x) * (1 + (scale[:, None] if scale.dim() == 2 else scale)) + (
        shift[:, None] if shift.dim() == 2 else shift)
    assert torch.equal(layernorm_scale_shift(norm, x, scale, shift, fused=False), want)


# impl_mode 2 takes float16 only (other dtypes: under bad inputs).
MODES = [(dtype, mode) for dtype in DTYPES for mode in (0, 1)] + [(torch.float16, 2)]


@pytest.mark.parametrize("dtype, impl_mode", MODES, ids=str)
@pytest.mark.parametrize("affine", ["random", "none", "no_bias"])
def test_fast_layernorm_matches_float64(dtype, impl_mode, affine):
    norm = layer_norm_module(127, dtype if impl_mode == 2 else torch.float32, affine)
    x = randn(2, 9, 127, dtype=dtype, mean=-0.4, std=2.0)
    out = fast_layernorm(norm, x, impl_mode=impl_mode)
    assert out.dtype == dtype
    close(out, reference_layer_norm(x, norm.weight, norm.bias, norm.eps))
    assert torch.equal(fast_layernorm(norm, x, impl_mode, fused=False), norm(x))


@pytest.mark.parametrize("normalized_shape", [(16,), (5, 16), (3, 5, 16)])
def test_fast_layernorm_over_several_dimensions(normalized_shape):
    norm = layer_norm_module(normalized_shape, torch.float32)
    x = randn(2, 3, 5, 16)
    close(fast_layernorm(norm, x),
          reference_layer_norm(x, norm.weight, norm.bias, norm.eps, len(normalized_shape)))


def test_large_mean_rows_keep_their_spread():
    # Rows of 1000 + N(0, 1): a variance taken as E[x²] - mean² in fp32 cancels 2^20 of the
    # 2^24 of fp32's precision (outputs off by ~0.1); the fp32 mean of 3072 values near 1000 is
    # within ~1e-4, hence outputs within ~1e-4.
    norm = layer_norm_module(3072, torch.float32, "none")
    x = randn(4, 3072, mean=1000.0)
    torch.testing.assert_close(fast_layernorm(norm, x).double(),
                               reference_layer_norm(x, None, None, norm.eps), atol=1e-3, rtol=0)


def test_zero_modulation_gives_layernorm_bit_for_bit():
    norm = layer_norm_module(96, torch.float32)
    x = randn(2, 6, 96)
    zeros = torch.zeros(2, 96)
    assert torch.equal(layernorm_scale_shift(norm, x, zeros, zeros), fast_layernorm(norm, x))
    per_token = torch.zeros(2, 6, 96)
    assert torch.equal(layernorm_scale_shift(norm, x, per_token, zeros), fast_layernorm(norm, x))


def test_empty_inputs():
    norm = layer_norm_module(8, torch.float32)
    out = layernorm_scale_shift(norm, torch.zeros(2, 0, 8), torch.zeros(2, 8), torch.zeros(2, 8))
    assert out.shape == (2, 0, 8)
    assert fast_layernorm(norm, torch.zeros(0, 8)).shape == (0, 8)


def bad_scale_shift_calls():
    norm = layer_norm_module(8, torch.float32)
    x, scale = torch.zeros(2, 3, 8), torch.zeros(2, 8)
    return [
        ((ditops.mindiesd.RMSNorm(8), x, scale, scale), "layernorm must be a torch.nn.LayerNorm"),
        ((norm, x.tolist(), scale, scale), "x must be a torch.Tensor"),
        ((norm, x, scale.numpy(), scale), "scale must be a torch.Tensor"),
        ((norm, x, scale, None), "shift must be a torch.Tensor"),
        ((norm, x, scale, scale, 1), "fused must be a bool"),
        ((norm, x[0], scale, scale), "x has 2 dimensions, expected 3"),
        ((norm, x, scale[0], scale), "scale has 1 dimensions"),
        ((norm, x, scale, torch.zeros(2, 3, 1, 8)), "shift has 4 dimensions"),
        ((norm, x, torch.zeros(1, 8), scale), "scale.size(0) (1) must equal x.size(0) (2)"),
        ((norm, x, scale, torch.zeros(3, 8)), "shift.size(0) (3) must equal x.size(0) (2)"),
        ((norm, x, torch.zeros(2, 2, 8), scale), "scale.size(1) (2) must be 1 or x.size(1) (3)"),
        ((norm, x, scale, torch.zeros(2, 4, 8)), "shift.size(1) (4) must be 1 or x.size(1)"),
        ((norm, x, torch.zeros(2, 9), scale), "scale.size(-1) (9) must equal x.size(-1) (8)"),
        ((norm, x, scale, torch.zeros(2, 7)), "shift.size(-1) (7) must equal scale.size(-1)"),
        ((layer_norm_module((3, 8), torch.float32), x, scale, scale),
         "normalized_shape [3, 8] must be [x.size(-1)]"),
        ((norm, x.double(), scale, scale), "x.dtype is torch.float64, expected torch.float32"),
    ]


@pytest.mark.parametrize("args, message", bad_scale_shift_calls())
def test_layernorm_scale_shift_bad_inputs(args, message):
    with pytest.raises(ParametersInvalid, match=re.escape(message)) as raised:
        layernorm_scale_shift(*args)
    assert isinstance(raised.value, ditops.Error)


def bad_fast_layernorm_calls():
    norm = layer_norm_module(8, torch.float32)
    x = torch.zeros(2, 3, 8)
    half = layer_norm_module(8, torch.float16)
    return [
        ((torch.nn.Linear(8, 8), x), {}, "norm must be a torch.nn.LayerNorm"),
        ((norm, x), {"fused": "yes"}, "fused must be a bool"),
        ((norm, x), {"impl_mode": 3}, "impl_mode (3) must be 0, 1 or 2"),
        ((norm, [1.0]), {}, "x must be a torch.Tensor"),
        ((layer_norm_module((2, 3, 8), torch.float32), x[0]), {}, "more dimensions than x (2)"),
        ((half, x), {"impl_mode": 2}, "impl_mode 2 requires x, norm.weight and norm.bias"),
        ((norm, x.half()), {"impl_mode": 2}, "impl_mode 2 requires"),
        ((norm, torch.zeros(2, 3, 9)), {}, "x's last dimensions [9] must equal"),
        ((norm, x.double()), {}, "fast_layernorm: x.dtype is torch.float64"),
    ]


@pytest.mark.parametrize("args, kwargs, message", bad_fast_layernorm_calls())
def test_fast_layernorm_bad_inputs(args, kwargs, message):
    with pytest.raises(ParametersInvalid, match=re.escape(message)):
        fast_layernorm(*args, **kwargs)


def test_gradients_are_refused():
    norm = layer_norm_module(8, torch.float32)
    with torch.enable_grad():
        x = randn(2, 3, 8).requires_grad_()
        with pytest.raises(RuntimeError, match="forward-only"):
            layernorm_scale_shift(norm, x, torch.zeros(2, 8), torch.zeros(2, 8))
        with pytest.raises(RuntimeError, match="forward-only"):
            fast_layernorm(norm, x)


def test_registered_op_schema_and_fake():
    x = randn(2, 5, 24)
    torch.library.opcheck(torch.ops.ditops.layer_norm_scale_shift,
                          (x, randn(24), None, randn(2, 1, 24), randn(2, 5, 24), 1e-6),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_function_agrees():
    norm = layer_norm_module(64, torch.float32)

    def block(x, emb):
        shift, scale = emb.chunk(2, dim=1)
        h = layernorm_scale_shift(norm, x, scale, shift)
        return fast_layernorm(norm, h * 2)

    args = (randn(2, 40, 64), randn(2, 128))
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), block(*args), atol=0, rtol=0)
