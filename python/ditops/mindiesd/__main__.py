"""python -m ditops.mindiesd script.py [args...] | -m module [args...]: runs an unmodified
program written for MindIE-SD with `import mindiesd` resolving to ditops (ditops.mindiesd.install),
as `python script.py [args...]` would run it."""

import os
import runpy
import sys

from . import install

USAGE = "usage: python -m ditops.mindiesd [--force] script.py [args...] | -m module [args...]"


def main(argv):
    force = bool(argv) and argv[0] == "--force"
    argv = argv[1:] if force else argv
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    install(force=force)
    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
