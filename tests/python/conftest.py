"""Shared set-up for the Python package tests (pytest, system python3, host backend).

CTest (tests/cmake/python.cmake) sets SYMPOOL_LIBRARY to the built libsympool.so and
SYMPOOL_DEVICE=host. By hand: SYMPOOL_DEVICE=host SYMPOOL_LIBRARY=build/libsympool.so
/usr/bin/python3 -m pytest tests/python

A run in which no test passed (nothing collected, everything skipped) fails: an empty run must
never look like a green one.
"""

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG_DIR = os.path.join(ROOT, "python")
if PKG_DIR not in sys.path:
    sys.path.insert(0, PKG_DIR)
# Subprocesses the tests start import the same package.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [PKG_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("SYMPOOL_DEVICE", "host")
# The package takes a relative SYMPOOL_LIBRARY from the folder Python starts in, and some tests
# start Python elsewhere: the by-hand command above (build/libsympool.so) failed there.
if os.environ.get("SYMPOOL_LIBRARY") and not os.path.isabs(os.environ["SYMPOOL_LIBRARY"]):
    os.environ["SYMPOOL_LIBRARY"] = os.path.abspath(os.environ["SYMPOOL_LIBRARY"])

_passed = [0]


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _passed[0] += 1


def pytest_sessionfinish(session, exitstatus):
    if _passed[0] == 0:
        print("\nsympool: no test passed (none collected, or all skipped): failing the run")
        session.exitstatus = 1


@pytest.fixture
def sp():
    """The sympool module, with recording off and the cache emptied after each test."""
    import gc

    import sympool
    yield sympool
    sympool.record_memory_history(enabled=None)
    # A MemPool a test dropped without destroy() goes at its collection (__del__), and a cycle
    # (a pytest.raises record holds the test's frame, which holds the record) keeps it until the
    # collector runs: collect now, so that no test finds an earlier test's pool, and its cached
    # segment, still there (the whole folder in one pytest process did, depending on when the
    # collector last ran).
    gc.collect()
    sympool.empty_cache()
