"""ditops.mindiesd against mindiesd 3.1.0's public surface: every name and submodule path, every
public signature (the table below was read off the real package's wheel with `inspect`-like
parsing; only the table is kept), MindIE-SD's semantics against torch float64 math (masks:
nonzero attends, whatever the dtype), torch's semantics under torch's name
(ditops.scaled_dot_product_attention), and `import mindiesd` through install() and the
`python -m ditops.mindiesd` runner."""

import importlib
import inspect
import itertools
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ditops
import ditops.mindiesd as mindiesd
from ditops.mindiesd.utils.exception import ParametersInvalid
from conftest import close, reference_attention

EMPTY = inspect.Parameter.empty

# mindiesd 3.1.0: public callables and their parameters in order (name, default or EMPTY);
# "*args" / "**kwargs" stand for variadic parameters.
SIGNATURES = {
    "attention_forward": [("query", EMPTY), ("key", EMPTY), ("value", EMPTY),
                          ("attn_mask", None), ("scale", None), ("fused", True),
                          ("head_first", False), ("**kwargs", EMPTY)],
    "attention_forward_varlen": [
        ("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("cu_seqlens_q", EMPTY),
        ("cu_seqlens_k", EMPTY), ("max_seqlen_q", None), ("max_seqlen_k", None),
        ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", None),
        ("softcap", None), ("alibi_slopes", None), ("deterministic", None),
        ("return_attn_probs", None), ("block_table", None)],
    "sparse_attention": [
        ("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("attn_mask", None), ("scale", None),
        ("is_causal", False), ("head_num", 1), ("input_layout", "BNSD"), ("inner_precise", 0),
        ("sparse_type", None), ("txt_len", 0), ("block_size", 128), ("latent_shape_q", None),
        ("latent_shape_k", None), ("video_spans", None), ("keep_sink", True),
        ("keep_recent", True), ("cdf_threshold", 1.0), ("sparsity", 0.0), ("precision", "bf16"),
        ("**kwargs", EMPTY)],
    "rotary_position_embedding": [("x", EMPTY), ("cos", EMPTY), ("sin", EMPTY),
                                  ("rotated_mode", "rotated_half"), ("head_first", False),
                                  ("fused", True)],
    "RMSNorm": [("hidden_size", EMPTY), ("eps", 1e-6)],
    "RMSNorm.forward": [("hidden_states", EMPTY), ("if_fused", True)],
    "fast_layernorm": [("norm", EMPTY), ("x", EMPTY), ("impl_mode", 0), ("fused", True)],
    "layernorm_scale_shift": [("layernorm", EMPTY), ("x", EMPTY), ("scale", EMPTY),
                              ("shift", EMPTY), ("fused", True)],
    "get_activation_layer": [("act_type", EMPTY)],
    "layers.muls_add": [("x", EMPTY), ("y", EMPTY), ("scale", EMPTY)],
    "layers.residual_gate_add": [("x", EMPTY), ("y", EMPTY), ("gate", EMPTY)],
    "quantize": [("model", EMPTY), ("quant_des_path", None), ("online_config", None),
                 ("**kwargs", EMPTY)],
    "TimestepPolicyConfig": [("default_strategy", "dynamic"), ("w4a4_default_strategy", "W4A4"),
                             ("fa_default_strategy", "MXFP4")],
    "TimestepPolicyConfig.register": [("step_range", EMPTY), ("strategy", EMPTY),
                                      ("target", "w4a4_linear")],
    "TimestepPolicyConfig.get_strategy": [("step", EMPTY), ("target", "w4a4_linear")],
    "TimestepManager.set_timestep_idx": [("cur_timestep", EMPTY)],
    "TimestepManager.get_timestep_idx": [],
    "TimestepManager.set_timestep_idx_max": [("t_idx", EMPTY)],
    "TimestepManager.get_timestep_idx_max": [],
    "CacheConfig": [("method", EMPTY), ("blocks_count", EMPTY), ("steps_count", EMPTY),
                    ("step_start", 0), ("step_interval", 1), ("step_end", 10000),
                    ("block_start", 0), ("block_end", 10000)],
    "CacheAgent": [("config", EMPTY)],
    "CacheAgent.apply": [("function", EMPTY), ("*args", EMPTY), ("**kwargs", EMPTY)],
}

# Features ditops refuses by name (FeatureNotSupported, never TypeError), with arguments a
# caller of the real package would pass.
REFUSED = {
    "fused_moe": (torch.zeros(2, 8), torch.zeros(2, 4), 4, 2, torch.zeros(4, 16, 8),
                  torch.zeros(4, 8, 8)),
    "frequency_regulator": (1800,),
}

SUBMODULES = [
    "layers", "layers.flash_attn", "layers.flash_attn.attention_forward",
    "layers.flash_attn.attention_forward_varlen", "layers.flash_attn.sparse_flash_attn",
    "layers.flash_attn.sparse_flash_attn_rf_v2", "layers.flash_attn.sparse_flash_attn_rf_v3",
    "layers.flash_attn.sparse_flash_attn_ada_bsa",
    "layers.norm", "layers.rope", "layers.activation", "layers.adalayernorm", "layers.muls_add",
    "layers.residual_gate_add", "layers.fused_moe", "quantization", "quantization.quantize",
    "quantization.mode",
    "quantization.config", "quantization.utils", "cache_agent", "cache_agent.cache",
    "cache_agent.cache_agent", "compilation", "utils", "utils.exception",
]


def resolve(path):
    obj = mindiesd
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def parameters(obj):
    """(name, default) of obj's signature, without self, variadics written as in SIGNATURES."""
    if inspect.isclass(obj):
        obj = obj.__init__
    result = []
    for p in inspect.signature(obj).parameters.values():
        if p.name in ("self", "cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        result.append((prefix + p.name, p.default, p.kind))
    return result


def test_every_public_name_and_submodule_exists():
    for name in mindiesd.__all__:
        assert hasattr(mindiesd, name), name
    for path in SUBMODULES:
        importlib.import_module("ditops.mindiesd." + path)
    # The top-level names are ditops' own too, one object each.
    for name in ("CacheConfig", "CacheAgent", "QuantConfig", "OnlineQuantConfig",
                 "TimestepManager", "TimestepPolicyConfig", "fast_layernorm",
                 "layernorm_scale_shift", "get_activation_layer", "RMSNorm", "quantize"):
        assert getattr(ditops, name) is getattr(mindiesd, name), name


@pytest.mark.parametrize("path", sorted(SIGNATURES))
def test_signature_accepts_what_mindiesd_accepts(path):
    """Same parameters, positions and defaults; ditops may add keyword-only parameters after
    them (and a **kwargs the real one lacks would hide typos: not allowed)."""
    ours = parameters(resolve(path))
    expected = SIGNATURES[path]
    assert [(n, d) for n, d, _ in ours[:len(expected)]] == expected, ours
    for name, _, kind in ours[len(expected):]:
        assert kind == inspect.Parameter.KEYWORD_ONLY, f"{path}: extra parameter {name}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_features_name_themselves(name):
    with pytest.raises(NotImplementedError, match=name) as error:
        getattr(mindiesd, name)(*REFUSED[name])
    assert isinstance(error.value, ParametersInvalid)


# ---- attention_forward: MindIE-SD's semantics --------------------------------------------------


def test_attention_masks_of_every_dtype_mean_nonzero_attends():
    b, s, n, d = 2, 37, 3, 32
    q, k, v = (torch.randn(b, s, n, d) for _ in range(3))
    keep = torch.rand(s, s) > 0.4
    keep[:, 0] = True
    want, _ = reference_attention(q, k, v, keep)
    for mask in (keep, keep.float(), keep.float() * 0.25, keep.to(torch.bfloat16),
                 keep.to(torch.float16), keep.to(torch.int64) * -7, keep.to(torch.uint8)):
        close(mindiesd.attention_forward(q, k, v, attn_mask=mask), want)
        close(mindiesd.attention_forward(q, k, v, attn_mask=mask, fused=False), want)
    # [B, N, Sq, Sk] masks, BNSD.
    keep4 = torch.rand(b, n, s, s) > 0.5
    keep4[..., 0] = True
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    want4, _ = reference_attention(qh, kh, vh, keep4, head_first=True)
    close(mindiesd.attention_forward(qh, kh, vh, keep4.float(), head_first=True), want4)


@pytest.mark.parametrize("op_type", ["fused_attn_score", "ascend_laser_attention",
                                     "prompt_flash_attn"])
@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH"])
def test_attention_npu_dispatch_keywords(op_type, layout):
    """opt_mode / op_type / layout choose an NPU kernel; every combination computes the same
    attention here, in the layout head_first says."""
    q, k, v = (torch.randn(1, 24, 2, 16) for _ in range(3))
    want, _ = reference_attention(q, k, v, scale=0.5)
    close(mindiesd.attention_forward(q, k, v, scale=0.5, opt_mode="manual", op_type=op_type,
                                     layout=layout), want)
    for mode in ("runtime", "static"):
        close(mindiesd.attention_forward(q, k, v, scale=0.5, opt_mode=mode), want)


def test_attention_bad_arguments_raise_parameters_invalid():
    q = torch.randn(1, 8, 2, 16)
    out = torch.full_like(q, 7.0)
    for kwargs in (dict(opt_mode="fastest"), dict(opt_mode="manual", op_type="npu_fa"),
                   dict(opt_mode="manual", layout="SBH"), dict(fused=1), dict(scale="big")):
        with pytest.raises(ParametersInvalid):
            mindiesd.attention_forward(q, q, q, out=out, **kwargs)
    with pytest.raises(ParametersInvalid):
        mindiesd.attention_forward(q[0], q[0], q[0])
    with pytest.raises(ParametersInvalid):  # the C++ refusal, as MindIE-SD's type
        mindiesd.attention_forward(q, q[:, :, :, :8], q, out=out)
    with pytest.raises(TypeError):
        mindiesd.attention_forward(q, q, q, casual=True)
    assert (out == 7.0).all()


def test_attention_forward_varlen_reserved_arguments():
    lengths = [5, 17, 1]
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), 2, 16) for _ in range(3))
    reserved = dict(window_size=None, softcap=None, alibi_slopes=None, deterministic=None,
                    return_attn_probs=None, block_table=None)
    out = mindiesd.attention_forward_varlen(q, k, v, cu, cu, causal=True, **reserved)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        want, _ = reference_attention(*(t[None, start:end] for t in (q, k, v)), causal=True)
        close(out[start:end], want[0])
    for name in reserved:
        with pytest.raises(ParametersInvalid, match=name):
            mindiesd.attention_forward_varlen(q, k, v, cu, cu, **{name: 1})


# ---- torch's semantics under torch's name ------------------------------------------------------


@pytest.mark.parametrize("sq,sk", [(33, 33), (20, 45), (45, 20)])
def test_scaled_dot_product_attention_matches_torch(sq, sk):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(2, 4, sq, 32, dtype=torch.float64)
    k, v = torch.randn(2, 4, sk, 32, dtype=torch.float64), torch.randn(2, 4, sk, 32,
                                                                        dtype=torch.float64)
    keep = torch.rand(sq, sk) > 0.3
    keep[:, 0] = True
    additive = torch.randn(2, 1, sq, sk, dtype=torch.float64)
    cases = [dict(), dict(attn_mask=keep), dict(attn_mask=additive), dict(is_causal=True),
             dict(scale=0.2)]
    for case in cases:
        ours_case = {key: (value.float() if torch.is_tensor(value) and value.is_floating_point()
                           else value) for key, value in case.items()}
        out = ditops.scaled_dot_product_attention(q.float(), k.float(), v.float(), **ours_case)
        close(out, sdpa(q, k, v, **case), torch.float32)
    # Grouped-query attention only when asked for, as torch.
    kv = torch.randn(2, 2, sk, 32, dtype=torch.float64)
    close(ditops.scaled_dot_product_attention(q.float(), kv.float(), kv.float(), enable_gqa=True),
          sdpa(q, kv, kv, enable_gqa=True), torch.float32)
    with pytest.raises(ditops.Error, match="enable_gqa"):
        ditops.scaled_dot_product_attention(q.float(), kv.float(), kv.float())
    with pytest.raises(ditops.Error, match="dropout_p"):
        ditops.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=0.1)


# ---- RoPE, norms, activations ------------------------------------------------------------------


def reference_rope(x, cos, sin, interleaved):
    x = x.double()
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.double() + rotated * sin.double()


@pytest.mark.parametrize("mode", ["rotated_half", "rotated_interleaved"])
def test_rope_layouts_and_table_dtypes(mode):
    s, b, n, d = 19, 2, 3, 32
    cos, sin = torch.randn(s, d), torch.randn(s, d)
    interleaved = mode == "rotated_interleaved"
    x = torch.randn(b, s, n, d)
    layouts = [  # (x, cos/sin as passed, head_first, the table broadcast against x)
        (x, (cos, sin), False, lambda t: t[None, :, None]),
        (x.transpose(1, 2), (cos, sin), True, lambda t: t[None, None]),
        (x.permute(1, 0, 2, 3).contiguous(), (cos[:, None, None], sin[:, None, None]), False,
         lambda t: t[:, None, None]),  # SBND with [S, 1, 1, D] tables
        (x, (cos[None, :, None], sin[None, :, None]), False, lambda t: t[None, :, None]),
    ]
    for xs, (c, s_), head_first, spread in layouts:
        out = mindiesd.rotary_position_embedding(xs, c, s_, mode, head_first)
        close(out, reference_rope(xs, spread(cos), spread(sin), interleaved))
    # Tables of another float dtype than x: computed in fp32, returned in x's dtype.
    xb = x.to(torch.bfloat16)
    out = mindiesd.rotary_position_embedding(xb, cos.half(), sin.half(), mode)
    assert out.dtype == torch.bfloat16
    close(out, reference_rope(xb, cos.half()[None, :, None], sin.half()[None, :, None],
                              interleaved))
    out = mindiesd.rotary_position_embedding(x, cos.bfloat16(), sin.bfloat16(), mode)
    assert out.dtype == torch.float32
    close(out, reference_rope(x, cos.bfloat16()[None, :, None], sin.bfloat16()[None, :, None],
                              interleaved))
    with pytest.raises(ParametersInvalid):
        mindiesd.rotary_position_embedding(x, cos[None], sin[None], mode)
    with pytest.raises(ParametersInvalid):
        mindiesd.rotary_position_embedding(x, cos, sin, "rotated_quarter")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rmsnorm_module(dtype):
    norm = mindiesd.RMSNorm(96, eps=1e-5)
    assert norm.variance_epsilon == 1e-5 and norm.weight.dtype == torch.float32
    norm.weight.data = torch.randn(96)
    x = torch.randn(3, 5, 96).to(dtype)
    rows = x.double()
    want = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    fused = norm(x)
    assert fused.dtype == dtype
    close(fused, want)
    # if_fused=False: MindIE-SD's torch formula (weight applied after the cast back).
    close(norm(x, if_fused=False), want, dtype)
    with pytest.raises(ParametersInvalid):
        norm(torch.randn(96))


def test_activations_muls_add_residual_gate_add():
    x = torch.randn(4, 33, dtype=torch.float64)
    expected = {
        "silu": x * torch.sigmoid(x), "swish": x * torch.sigmoid(x),
        "gelu": 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
        "gelu-tanh": 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "gelu-fast": x / (1 + torch.exp(-1.702 * x)),
        "relu": x.clamp(min=0), "mish": x * torch.tanh(torch.log1p(torch.exp(x))),
    }
    for name, want in expected.items():
        torch.testing.assert_close(mindiesd.get_activation_layer(name.upper())(x), want)
    with pytest.raises(ParametersInvalid):
        mindiesd.get_activation_layer("swiglu")
    from ditops.mindiesd.layers import muls_add, residual_gate_add

    y, gate = torch.randn(4, 33), torch.randn(33)
    torch.testing.assert_close(muls_add(x.float(), y, 0.5), (x * 0.5 + y.double()).float())
    out = residual_gate_add(x.bfloat16(), y, gate)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(),
                               (x.bfloat16().double() + y.double() * gate.double()),
                               atol=2**-7, rtol=2**-7)


# ---- import mindiesd ---------------------------------------------------------------------------


def run_python(code, *args, env_path=None, cwd=None):
    env = dict(os.environ)
    if env_path:
        env["PYTHONPATH"] = os.pathsep.join([env_path, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args] if not code else [sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


PROGRAM = textwrap.dedent("""
    import sys
    from mindiesd.layers.flash_attn.attention_forward import attention_forward
    import torch
    from mindiesd.layers import rotary_position_embedding
    from mindiesd.quantization import TimestepManager
    from mindiesd.cache_agent import CacheConfig
    from mindiesd import RMSNorm, CacheAgent, OnlineQuantConfig, fast_layernorm
    import mindiesd.layers.flash_attn
    q = torch.randn(1, 16, 2, 8)
    out = attention_forward(q, q, q, attn_mask=torch.ones(16, 16), opt_mode="manual",
                            op_type="ascend_laser_attention", layout="BSND")
    ref = torch.nn.functional.scaled_dot_product_attention(*(q.transpose(1, 2),) * 3)
    assert (out - ref.transpose(1, 2)).abs().max() < 1e-5
    print("ran on", type(attention_forward).__module__, sys.argv[1:])
    """)


def test_install_and_runner(tmp_path):
    script = tmp_path / "uses_mindiesd.py"
    script.write_text(PROGRAM)
    installed = run_python("import ditops.mindiesd; ditops.mindiesd.install(); "
                           "import runpy; runpy.run_path(" + repr(str(script)) + ")")
    assert installed.returncode == 0, installed.stderr
    ran = run_python(None, "-m", "ditops.mindiesd", str(script), "--steps", "3")
    assert ran.returncode == 0 and "['--steps', '3']" in ran.stdout, ran.stderr
    # Without the alias the script fails as it would on a machine without MindIE-SD.
    assert run_python(None, str(script)).returncode != 0


def test_install_never_shadows_a_real_mindiesd(tmp_path):
    real = tmp_path / "mindiesd"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    refused = run_python("import ditops.mindiesd as m; m.install()", env_path=str(tmp_path))
    assert refused.returncode != 0 and "real mindiesd" in refused.stderr
    forced = run_python("import ditops.mindiesd as m; m.install(force=True); import mindiesd; "
                        "assert not hasattr(mindiesd, 'REAL') and m.installed()",
                        env_path=str(tmp_path))
    assert forced.returncode == 0, forced.stderr
