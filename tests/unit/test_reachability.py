"""Reachability of `src/` from the product, and the import graph of `bench/`, read from the
source (nothing is imported).

- Every module under `src/` is reached by imports from one of the product's entry points:
  the `[project.scripts]` targets of pyproject.toml (the `ragpilot` CLI), every Serve
  `import_path` in a `configs/` or `deploy/` YAML file (the app builder), and every
  `python -m MODULE` that README.md, `docs/`, `runbooks/` or `scripts/` name, and every
  package's `__main__`. A module that
  only `bench/` or `tests/` import is an experiment left behind or a product feature nobody
  wired in: delete it or wire it. The few that remain are `ALLOWED_UNREACHED`, each with its
  reason; an entry that is no longer true (reached, or deleted) fails the test, so the list
  only shrinks.
- `bench/*.py` has no import cycle (one benchmark may use another's helpers, never both ways).

Edges are the layering test's (`tests/unit/test_layering.py`: every import counts, including
those inside functions, `from X import y` counts as importing X and X.y), plus two that make
Python run a module: importing `a.b.c` runs the packages `a` and `a.b`, and a package's
`__init__` importing its own children reaches them.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

from tests.unit.test_layering import SRC, _cycles, _modules, _raw_imports

REPO = SRC.parent
BENCH = REPO / "bench"

ALLOWED_UNREACHED: dict[str, str] = {}
"""Modules under src/ that only bench/ or tests/ import, each with why it stays for now."""

PYTHON_M = re.compile(r"(?<![\w-])-m\s+([A-Za-z_][\w.]*)")
IMPORT_PATH = re.compile(r"^\s*import_path:\s*['\"]?([\w.]+):", re.MULTILINE)


@cache
def _entry_points() -> dict[str, str]:
    """Project module -> where it is named as an entry point."""
    mods = _modules()
    found: dict[str, str] = {}
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        found.setdefault(target.split(":")[0], f"pyproject.toml [project.scripts] {name}")
    for folder in ("configs", "deploy"):
        for f in sorted((REPO / folder).rglob("*.y*ml")):
            for m in IMPORT_PATH.finditer(f.read_text()):
                found.setdefault(m.group(1), str(f.relative_to(REPO)))
    prose = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "runbooks").glob("*.md")), *sorted((REPO / "scripts").glob("*"))]
    for f in prose:
        if f.is_file():
            for m in PYTHON_M.finditer(f.read_text(errors="ignore")):
                mod = m.group(1)  # `python -m pkg` runs pkg/__main__.py
                mod = f"{mod}.__main__" if f"{mod}.__main__" in mods else mod
                found.setdefault(mod, f"`python -m` in {f.relative_to(REPO)}")
    for m in mods:  # a package's __main__ exists to be run: `python -m package`
        if m.endswith(".__main__"):
            found.setdefault(m, "a package's __main__")
    return {m: where for m, where in found.items() if m in mods}


def _targets(name: str, raw: set[str], known) -> set[str]:
    """The `known` modules among the dotted names `raw` that module `name` imports (each
    mapped to the deepest known module it names), own children included."""
    out = set()
    for imp in raw:
        parts = imp.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts and ".".join(parts) != name:
            out.add(".".join(parts))
    return out


@cache
def _src_imports(name: str) -> set[str]:
    return _targets(name, _raw_imports(name), _modules())


def _reached(roots) -> set[str]:
    mods = _modules()
    seen: set[str] = set()
    work = list(roots)
    while work:
        mod = work.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))} & set(mods)
        work.extend((_src_imports(mod) | parents) - seen)
    return seen


@cache
def unreached() -> frozenset[str]:
    return frozenset(_modules()) - _reached(_entry_points())


def test_entry_points_are_read_from_the_repository():
    entries = _entry_points()
    assert {"serving.cli", "serving.app", "rl.adaptation.teacher",
            "rag.generation.local"} <= set(entries)
    assert "pyproject" in entries["serving.cli"]


def test_reachability_follows_imports_parents_and_children():
    reached = _reached(["serving.cli"])
    # serving/cli/__init__.py imports its command modules inside build_parser
    assert {"serving.cli.tune", "serving.cli.data"} <= reached
    # importing rl.kernel.settings runs the packages rl and rl.kernel
    assert {"rl", "rl.kernel"} <= _reached(["rl.kernel.settings"])
    assert "serving.cli" not in _reached(["rag.config"])


def test_every_src_module_is_reached_from_the_product():
    stale = {m: why for m, why in ALLOWED_UNREACHED.items() if m not in unreached()}
    assert not stale, f"reached or deleted now, drop from ALLOWED_UNREACHED: {sorted(stale)}"
    only_bench_or_tests = sorted(unreached() - set(ALLOWED_UNREACHED))
    assert only_bench_or_tests == [], (
        "modules no entry point imports (only bench/ or tests/ do): delete them, wire them "
        f"into the product, or list them with a reason: {only_bench_or_tests}")


# --- bench/ ---------------------------------------------------------------------------------

ALLOWED_BENCH_CYCLES: dict[tuple[str, str], str] = {}
"""Import cycles among bench/*.py still present, each with why."""


@cache
def _bench_modules() -> dict[str, Path]:
    return {f"bench.{f.stem}": f for f in sorted(BENCH.glob("*.py")) if f.stem != "__init__"}


def _bench_raw_imports(name: str) -> set[str]:
    path = _bench_modules()[name]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    return out


def _bench_imports(name: str) -> set[str]:
    return _targets(name, _bench_raw_imports(name), _bench_modules())


def bench_cycles() -> list[list[str]]:
    mods = _bench_modules()
    return _cycles({m: sorted(_bench_imports(m)) for m in mods})


def test_bench_graph_reads_the_source():
    mods = _bench_modules()
    assert "bench.common" in mods and "bench.common" in _bench_imports("bench.objectives")


def test_no_import_cycle_in_bench():
    cycles = {tuple(c) for c in bench_cycles()}
    stale = set(ALLOWED_BENCH_CYCLES) - cycles
    assert not stale, f"gone now, drop from ALLOWED_BENCH_CYCLES: {sorted(stale)}"
    assert sorted(cycles - set(ALLOWED_BENCH_CYCLES)) == []
