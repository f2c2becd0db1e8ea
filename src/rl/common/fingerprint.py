"""Code fingerprints: cache keys that change when the code that fills the cache does.

`code_fingerprint(modules)` hashes the normalised source (no comments, docstrings or layout) of
`modules` and every project module they import, transitively: `rl.kernel.evaluator` keys its
per-query tables with it and `rl.common.memo` its retrieval memo, so changed scoring, stage or
retriever code misses the cache instead of reusing stale rows.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import textwrap
from collections.abc import Sequence
from pathlib import Path


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
    return tree


def normalized_code(source: str) -> str:
    """The code of `source` without comments, docstrings or layout (its AST dump): edits to
    documentation do not change it, edits to behaviour do."""
    return ast.dump(_strip_docstrings(ast.parse(textwrap.dedent(source))),
                    include_attributes=False)


def _package_dirs(packages: Sequence[str]) -> dict[str, Path]:
    out = {}
    for p in packages:
        spec = importlib.util.find_spec(p)
        if spec is not None and spec.submodule_search_locations:
            out[p] = Path(next(iter(spec.submodule_search_locations)))
    return out


def _module_file(name: str, roots: dict[str, Path]) -> Path | None:
    top, *rest = name.split(".")
    if top not in roots:
        return None
    p = roots[top].joinpath(*rest)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def module_closure(modules: Sequence[str], stop: Sequence[str] = (),
                   packages: dict[str, Path] | None = None) -> dict[str, Path]:
    """`modules` and every project module they import, transitively (module name → source
    file), found statically from the sources (imports inside functions included). Only modules
    of `packages` (default: rag and rl, located by import) are followed; a module named in `stop`,
    or inside a package named there, is neither included nor followed."""
    roots = packages if packages is not None else _package_dirs(("rag", "rl"))
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen or any(name == s or name.startswith(s + ".") for s in stop):
            continue
        f = _module_file(name, roots)
        if f is None:
            continue
        seen[name] = f
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return seen


def code_fingerprint(modules: Sequence[str], stop: Sequence[str] = (),
                     extra: Sequence[str] = (), packages: dict[str, Path] | None = None) -> str:
    """12 hex of sha256 over the normalised code (`normalized_code`) of `module_closure(modules,
    stop)` and of the `extra` source snippets: a version for caches whose content those modules
    compute."""
    h = hashlib.sha256()
    for name, f in sorted(module_closure(modules, stop, packages).items()):
        h.update(f"{name}\0{normalized_code(f.read_text(encoding='utf-8'))}\0".encode())
    for src in extra:
        h.update(f"\0{normalized_code(src)}".encode())
    return h.hexdigest()[:12]
