"""MindIE-SD's torch.compile backend. On the CPU, MindieSDBackend hands the graph to torch's
own compiler (inductor): MindIE-SD's NPU fusion patterns (npu_rms_norm, npu_rotary_mul, ...) have
no CPU kernels to fuse into. CompilationConfig keeps MindIE-SD's settings as class attributes,
accepted and unused on the CPU."""

import dataclasses


@dataclasses.dataclass
class FusionPatterns:
    """MindIE-SD's switches for its NPU fusion patterns (no effect on the CPU)."""

    enable_rms_norm: bool = True
    enable_rope: bool = True
    enable_adalayernorm: bool = True
    enable_fast_gelu: bool = True
    enable_mul_add: bool = True


class CompilationConfig:
    """A static settings class, as MindIE-SD's (instantiating it raises RuntimeError)."""

    enable_freezing: bool = True
    graph_log_url = None
    fusion_patterns: FusionPatterns = FusionPatterns()
    aclgraph_only: bool = False
    aclgraph_with_compile: bool = False
    safe_output_mode: bool = True
    aclgraph_lazy_capture: bool = False
    aclgraph_max_entries: int = 0

    def __init__(self):
        raise RuntimeError("CompilationConfig is a static class, do not instantiate it")


class MindieSDBackend:
    """A torch.compile backend: `torch.compile(model, backend=MindieSDBackend())` compiles
    with inductor for the CPU."""

    def __call__(self, graph, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs)


__all__ = ["MindieSDBackend", "CompilationConfig"]
