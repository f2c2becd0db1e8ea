"""Every benchmark script imports: they share helpers across files (bench/ope.py reads
bench/policy.py's splits and delta rows), so a rename in one must not silently break
another that no test runs end to end. And it imports without the evaluation data: each module
is imported afresh (with the bench modules it imports) while `data_root` raises as it does on
a machine without ../shared, so a data path resolved at import time fails here, not only in a
clean clone without the data."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_the_bench_folder_has_scripts():
    assert len(MODULES) >= 20 and {"policy", "ope", "drift", "search"} <= set(MODULES)


def _no_data_root():
    from rag.errors import DataError

    raise DataError("RAGPILOT_DATA", "no dataset root found (this test hides the data)")


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name, monkeypatch):
    monkeypatch.setattr("rag.corpus.loaders.data_root", _no_data_root)
    for cached in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        monkeypatch.delitem(sys.modules, cached)  # put back after the test
    mod = importlib.import_module(f"bench.{name}")
    assert mod.__doc__, f"bench/{name}.py states what it measures in its docstring"
