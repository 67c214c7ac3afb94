"""One definition per operator, used three ways: called eagerly (outputs allocated of the
caller's kind, then the C++ call), as the CPU kernel of its torch.library custom op, and as that
op's fake (the same output shapes, nothing run) for torch.compile."""

from . import _arrays

REGISTRY = {}


class Op:
    """`outputs(*args)` gives each output's (shape, dtype): shape None and dtype None are
    args[0]'s, else a tuple and a numpy dtype name; `run(*args, *outputs)` fills them. `schema` is the torch.library
    signature of args -> outputs."""

    def __init__(self, name, schema, outputs, run):
        self.name = name
        self.schema = schema
        self.outputs = outputs
        self.run = run
        REGISTRY[name] = self

    def allocate(self, args, out=None):
        """The outputs; `out` (the caller's array) stands in for the first."""
        like, specs = args[0], self.outputs(*args)
        if out is None:
            return [_arrays.empty(like, shape, dtype) for shape, dtype in specs]
        return [out] + [_arrays.empty(like, shape, dtype) for shape, dtype in specs[1:]]

    def __call__(self, *args, out=None):
        specs = self.outputs(*args)
        if len(specs) == 1:  # the common case, without lists and tuples
            result = _arrays.empty(args[0], *specs[0]) if out is None else out
            self.run(*args, result)
            return result
        outs = self.allocate(args, out)
        self.run(*args, *outs)
        return tuple(outs)

    def fake(self, *args):
        outs = self.allocate(args)
        return outs[0] if len(outs) == 1 else tuple(outs)


def call(op, *args, out=None):
    """Runs `op`: through its torch custom op while torch.compile traces (so the graph holds
    it, and `out` is written by a copy), directly otherwise (the dispatcher's overhead is not
    paid per eager call, and `out` is written in place)."""
    if not _arrays.torch_compiling(args[0]):
        return op(*args, out=out)
    result = getattr(_arrays.torch.ops.ditops, op.name)(*args)
    if out is not None:
        first = result[0] if isinstance(result, tuple) else result
        out.copy_(first)
        result = (out,) + tuple(result[1:]) if isinstance(result, tuple) else out
    return result


def register_torch_ops():
    """Every Op as torch.ops.ditops.<name>, with its fake and an autograd formula that refuses
    the backward pass (ditops is forward-only)."""
    torch = _arrays.torch
    library = torch.library.Library("ditops", "DEF")
    for op in REGISTRY.values():
        library.define(op.name + op.schema)
        library.impl(op.name, op, "CPU")
        qualified = "ditops::" + op.name
        torch.library.register_fake(qualified, op.fake, lib=library)

        def refuse(ctx, *grads, name=op.name):
            raise RuntimeError(f"ditops.{name} is forward-only: it has no gradient")

        torch.library.register_autograd(
            qualified, refuse, setup_context=lambda ctx, inputs, output: None, lib=library
        )
    return library
