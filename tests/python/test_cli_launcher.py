"""The pip-installed `sympool` console script (sympool/_cli.py) runs the command with the
signal dispositions a shell gives it: not Python's own ignored SIGPIPE and SIGXFSZ, which exec
keeps (a closed pipe was then a write error of the command's, not its death by SIGPIPE); a
signal the caller ignored stays ignored."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

import sympool._cli


def _ignored_mask(tmp_path, preexec=None):
    """SigIgn of the command the console script runs (a script in its bin/ that reads its own
    /proc status)."""
    pkg = tmp_path / "pkg"
    (pkg / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(sympool._cli.__file__, pkg / "_cli.py")
    exe = pkg / "bin" / "sympool"
    exe.write_text("#!/bin/sh\nexec grep SigIgn /proc/self/status\n")
    exe.chmod(0o755)
    code = f"import sys; sys.path.insert(0, {str(pkg)!r}); import _cli; _cli.main()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, preexec_fn=preexec)
    assert out.returncode == 0 and out.stdout.startswith("SigIgn:"), (out.stdout, out.stderr)
    return int(out.stdout.split()[1], 16)


def _bit(sig):
    return 1 << (int(sig) - 1)


def test_console_script_gives_the_command_the_default_sigpipe_and_sigxfsz(tmp_path):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    mask = _ignored_mask(tmp_path)
    assert not mask & _bit(signal.SIGPIPE), hex(mask)
    assert not mask & _bit(signal.SIGXFSZ), hex(mask)


def test_console_script_keeps_a_signal_the_caller_ignores(tmp_path):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")

    def ignore():  # a background job of a shell: SIGINT ignored; nohup: SIGHUP
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    mask = _ignored_mask(tmp_path, ignore)
    assert mask & _bit(signal.SIGINT) and mask & _bit(signal.SIGHUP), hex(mask)
