"""Every benchmark script imports: they share helpers across files (bench/ope.py reads
bench/policy.py's splits and delta rows), so a rename in one must not silently break
another that no test runs end to end."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_the_bench_folder_has_scripts():
    assert len(MODULES) >= 20 and {"policy", "ope", "drift", "search"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    mod = importlib.import_module(f"bench.{name}")
    assert mod.__doc__, f"bench/{name}.py states what it measures in its docstring"
