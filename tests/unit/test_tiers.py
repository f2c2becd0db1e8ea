"""The test tiers of tests/conftest.py name modules that exist, and a module that starts Ray
Serve or an external server sits in the `serve` or `system` tier (so `pytest -m "unit or
component"` never starts one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import TIERS, _group_serve_app_modules, tier_of

TESTS = Path(__file__).resolve().parents[1]
MODULES = {p.stem: p for p in TESTS.glob("test_*.py")}
STARTS_A_SERVER = ("start_local(", "serve_app", "netns_script_report(", "initdb", "prometheus",
                   "haproxy")


def test_every_named_module_exists():
    named = {m for mods in TIERS.values() for m in mods}
    assert sorted(named - set(MODULES)) == []
    assert sum(len(m) for m in TIERS.values()) == len(named), "a module in two tiers"


@pytest.mark.parametrize("stem", sorted(MODULES))
def test_a_module_that_starts_a_server_is_serve_or_system(stem):
    text = MODULES[stem].read_text()
    if any(s in text for s in STARTS_A_SERVER):
        assert tier_of(MODULES[stem]) in ("serve", "system"), stem


def test_tiers_by_path():
    assert tier_of(TESTS / "unit" / "test_tiers.py") == "unit"
    assert tier_of(TESTS / "test_pipeline.py") == "component"
    assert tier_of(TESTS / "test_multinode.py") == "system"


def test_modules_sharing_the_serve_app_run_one_after_another():
    """Whole modules that use `serve_app` move to the first one's place, in their own order;
    every other module keeps its place, and no module is split."""
    from types import SimpleNamespace

    def item(mod: str, *fixtures: str):
        return SimpleNamespace(fspath=f"/t/{mod}.py", fixturenames=["tmp_path", *fixtures],
                               name=mod)

    items = [item("a"), item("b"), item("b", "serve_app"), item("c"), item("d", "serve_app"),
             item("e"), item("f", "serve_app"), item("f")]
    _group_serve_app_modules(items)
    assert [i.name for i in items] == ["a", "b", "b", "d", "f", "f", "c", "e"]
    alone = [item("a"), item("b", "serve_app"), item("c")]
    _group_serve_app_modules(alone)
    assert [i.name for i in alone] == ["a", "b", "c"]
