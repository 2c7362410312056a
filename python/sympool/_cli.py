"""_cli: the `sympool` console script of a pip-installed package runs the command built with it
(sympool/bin/sympool, the same program as the CMake build's build/sympool)."""

import os
import signal
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sympool")
    if not os.access(exe, os.X_OK):
        sys.exit(f"sympool: {exe} is missing: this package was not installed with pip, use the "
                 "CMake build's sympool (build/sympool, or <prefix>/bin/sympool)")
    # Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays ignored across
    # exec: the command then met a closed pipe (`sympool info --json T | head -c 9`) as a write
    # error of its own, and a file past the size limit as EFBIG, where the CMake build's command
    # dies of the signal, as every command in a pipeline does. Put back to the default, as
    # subprocess does for its children (restore_signals); a signal the user's shell ignored
    # (nohup's SIGHUP, a background job's SIGINT) Python leaves ignored, and so does this.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
