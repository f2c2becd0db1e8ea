"""Every benchmark script imports: they share helpers across files (bench/common.py), so a
rename in one must not silently break another that no test runs end to end. And they import
without the evaluation data (a machine without ../shared): a data path resolved at import time
would fail there."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_the_bench_folder_has_scripts():
    assert "common" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    mod = importlib.import_module(f"bench.{name}")
    assert mod.__doc__, f"bench/{name}.py states what it measures in its docstring"


NO_DATA = """
import importlib, sys
import rag.corpus.loaders as loaders
from rag.errors import DataError

def no_data_root():
    raise DataError("RAGPILOT_DATA", "no dataset root found (the test hides the data)")

loaders.data_root = no_data_root
for name in sys.argv[1:]:
    importlib.import_module("bench." + name)
"""


def test_bench_modules_import_without_the_evaluation_data():
    """In a fresh interpreter whose `data_root` raises as it does without ../shared (a
    subprocess, so the patched function never leaks into modules other tests import)."""
    repo = BENCH.parent
    run = subprocess.run([sys.executable, "-c", NO_DATA, *MODULES], cwd=repo,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ,
                              "PYTHONPATH": f"{repo / 'src'}:{repo}"})
    assert run.returncode == 0, run.stderr[-3000:]
