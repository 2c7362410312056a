"""_cli: the `sympool` console script of a pip-installed package runs the command built with it
(sympool/bin/sympool, the same program as the CMake build's build/sympool)."""

import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sympool")
    if not os.access(exe, os.X_OK):
        sys.exit(f"sympool: {exe} is missing: this package was not installed with pip, use the "
                 "CMake build's sympool (build/sympool, or <prefix>/bin/sympool)")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
