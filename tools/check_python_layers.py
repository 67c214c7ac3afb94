#!/usr/bin/env python3
"""The import-layers contract of the ditops Python package, checked from its sources (no
import is run): three layers that import only downward.

  core       ditops.*, except the two below: imports no other layer.
  mindiesd   ditops.mindiesd.*: MindIE-SD's module paths over the core; imports the core and
             itself; nothing outside it imports it.
  diffusers  ditops.diffusers.*: the diffusers integration; imports the core and itself, and
             only ditops.diffusers._internals imports the diffusers package.

Every import statement counts, at module level or inside a function, absolute or relative.
Usage: check_python_layers.py PACKAGE_DIR (the directory of ditops/__init__.py). Prints each
violation as path:line: message and exits 1 if there is one."""

import ast
import pathlib
import sys

ADAPTERS = ("mindiesd", "diffusers")
DIFFUSERS_GATEWAY = "ditops.diffusers._internals"


def module_name(package_dir, path):
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts), path.name == "__init__.py"


def layer(module):
    """'core', 'mindiesd' or 'diffusers' for a module of the ditops package, else None."""
    parts = module.split(".")
    if parts[0] != "ditops":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ADAPTERS else "core"


def imported_modules(node, module, is_package):
    """The absolute names an import statement in `module` brings in (for `from X import a, b`:
    X.a and X.b, which are submodules or names of X; both are judged by their layer)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module
    return [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]


def problems(module, own, targets):
    """What is wrong with `module` (of layer `own`) importing `targets`."""
    for target in targets:
        other, top = layer(target), target.split(".")[0]
        if other is not None and other != "core" and other != own:
            yield f"{module} ({own}) imports {target} ({other})"
        if top == "diffusers" and own != "diffusers":
            yield f"{module} ({own}) imports {target}: only ditops.diffusers uses diffusers"
        if top == "diffusers" and own == "diffusers" and module != DIFFUSERS_GATEWAY:
            yield (f"{module} imports {target}: only {DIFFUSERS_GATEWAY} imports diffusers")


def violations(package_dir):
    package_dir = pathlib.Path(package_dir).resolve()
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module, is_package = module_name(package_dir, path)
        own = layer(module)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
            found += [f"{where}: {problem}" for problem in
                      problems(module, own, imported_modules(node, module, is_package))][:1]
    return sorted(set(found))


def main(argv):
    if len(argv) != 2 or not (pathlib.Path(argv[1]) / "__init__.py").is_file():
        print("usage: check_python_layers.py PACKAGE_DIR (holding ditops/__init__.py)",
              file=sys.stderr)
        return 2
    found = violations(argv[1])
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} import(s) against the layers of the ditops package", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
