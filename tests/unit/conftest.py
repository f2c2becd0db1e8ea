"""The fast tier: tests that need neither Ray nor model weights nor index builds (`make
test-unit`, under a minute on 2 cores). Shared fixtures live in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """A test marked slow (model weights) or ray does not belong in the fast tier."""
    bad = [i.nodeid for i in items if UNIT in Path(str(i.path)).parents
           and any(m.name in ("slow", "ray") for m in i.iter_markers())]
    if bad:
        raise pytest.UsageError(f"tests/unit holds tests marked slow or ray: {bad}")
