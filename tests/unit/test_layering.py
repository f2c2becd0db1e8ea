"""Layering of the packages in src/, read from the source (nothing is imported).

- `rag` imports neither `rl` nor `serving` (the stack is tunable without the control plane);
  `rl` never imports `serving`.
- `rl.kernel` (the scoring kernel) imports no consumer of it (`rl.tuner`, `rl.routing`,
  `rl.promotion`, `rl.selection`, `rl.adaptation`);
- `rl.selection` and `rl.adaptation` never import `rl.tuner`; `rl.stats` imports nothing else
  from `rl` (statistics any layer may use); `serving.app` never imports `serving.cli`.
- No import cycle among the project's modules.

Every import counts, including those inside functions. An import names the deepest project
module it reaches (`from rl.kernel import space` -> `rl.kernel.space`; `from rl.tuner import
TunerSettings` -> `rl.tuner`); a package's `__init__` importing its own children is not a cycle.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("rag", "rl", "serving")


@cache
def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the project packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((SRC / pkg).rglob("*.py")):
            parts = f.relative_to(SRC).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _is_package(name: str) -> bool:
    return _modules()[name].name == "__init__.py"


def _raw_imports(name: str) -> set[str]:
    """Dotted names this module imports (absolute; relative imports resolved), with
    `from X import y` giving both X and X.y."""
    path = _modules()[name]
    here = name.split(".") if _is_package(name) else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return out


@cache
def _imports(name: str) -> frozenset[str]:
    """The project modules `name` imports: each imported name mapped to the deepest existing
    module it names (prefix walk), without `name` itself and, for a package, its descendants."""
    mods = _modules()
    out = set()
    for imp in _raw_imports(name):
        parts = imp.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        if not parts:
            continue  # not a project module (stdlib, third party)
        target = ".".join(parts)
        if target == name or (_is_package(name) and target.startswith(name + ".")):
            continue
        out.add(target)
    return frozenset(out)


def _violations(sources: str | tuple[str, ...], forbidden, allowed=()) -> dict[str, list[str]]:
    """Modules under `sources` that import a module under `forbidden` (and not under
    `allowed`) -> the offending imports."""
    def under(mod: str, roots) -> bool:
        roots = (roots,) if isinstance(roots, str) else roots
        return any(mod == r or mod.startswith(r + ".") for r in roots)

    bad = {}
    for mod in _modules():
        if under(mod, sources):
            hits = sorted(t for t in _imports(mod) if under(t, forbidden) and not under(t, allowed))
            if hits:
                bad[mod] = hits
    return bad


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(graph[v]):
                work.append((v, i + 1))
                w = graph[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(out)


def test_module_graph_reads_the_source():
    mods = _modules()
    assert {"rag.metrics.support", "rl.tuner", "rl.stats.bootstrap", "serving.app"} <= set(mods)
    assert "rag.metrics.claims" in _imports("rag.metrics.support")
    # an import inside a function counts
    assert "rag.metrics.claims" in _imports("rag.metrics.cost")


def test_rag_imports_neither_rl_nor_serving():
    assert len([m for m in _modules() if m.startswith("rag.")]) >= 5
    assert _violations("rag", ("rl", "serving")) == {}


def test_rl_does_not_import_serving():
    assert _violations("rl", "serving") == {}


def test_selection_and_adaptation_do_not_import_the_tuner():
    assert _violations(("rl.selection", "rl.adaptation"), "rl.tuner") == {}


def test_kernel_imports_no_consumer():
    # the scoring kernel is what tuner, policy, promotion and serving score with: it may use
    # rl.common and rl.stats, never a consumer
    assert len([m for m in _modules() if m.startswith("rl.kernel.")]) >= 4
    consumers = ("rl.tuner", "rl.routing", "rl.promotion", "rl.selection", "rl.adaptation")
    assert _violations("rl.kernel", consumers) == {}


def test_stats_imports_nothing_else_from_rl():
    assert _violations("rl.stats", "rl", allowed="rl.stats") == {}


def test_serving_app_does_not_import_the_cli():
    assert _violations("serving.app", "serving.cli") == {}


def _project_cycles() -> list[list[str]]:
    return _cycles({m: sorted(_imports(m)) for m in _modules()})


def test_cycle_finder():
    graph = {"a": ["b"], "b": ["c", "e"], "c": ["a"], "d": ["a", "d"], "e": ["f"], "f": ["e"]}
    assert _cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycles():
    assert _project_cycles() == []
