"""The prose points at real code: every `rag.` / `rl.` / `serving.` dotted name in README.md,
docs/ and runbooks/ resolves to a module and a name defined in it (read statically, nothing is
imported), and every repository path they name exists. Code moves; this keeps the docs moving
with it (docs/architecture.md is the map a newcomer reads first)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.unit.test_docs_numbers import checked_text

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PROSE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "runbooks").glob("*.md"))]
DOTTED = re.compile(r"`((?:rag|rl|serving)(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")
PATH = re.compile(r"(?<![\w/.-])((?:bench|configs|src|tests|docs|runbooks|dashboards|deploy|"
                  r"scripts)/[\w./-]*\w)(?![\w<*])")
NOT_CODE = {"rag.k"}
"""Dotted names that are not code: a config field as an error message names it."""


def _module_file(parts: list[str]) -> Path | None:
    p = SRC.joinpath(*parts)
    for f in (p / "__init__.py", p.with_suffix(".py")):
        if f.exists():
            return f
    return None


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds (defs, classes, assignments, imports; also inside
    top-level if/try blocks)."""
    out: dict[str, ast.AST] = {}
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[n.name] = n
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                out.update({x.id: n for x in ast.walk(t) if isinstance(x, ast.Name)})
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: n for a in n.names})
        elif isinstance(n, (ast.If, ast.Try)):
            for block in (n.body, n.orelse, *(h.body for h in getattr(n, "handlers", []))):
                out.update(_names(block))
    return out


def _members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """A class's names: its body's, and the `self.x` its methods assign."""
    out = _names(cls.body)
    for m in cls.body:
        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for x in ast.walk(m):
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) \
                        and x.value.id == "self":
                    out.setdefault(x.attr, m)
    return out


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def resolves(ref: str) -> bool:
    """`ref` = a module path, then names defined in it (a class's members may follow; past a
    function or an imported name nothing more is checked)."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        f = _module_file(parts[:i])
        if f is not None:
            break
    else:
        return False
    node: ast.AST | None = None
    scope = _names(_tree(f).body)
    for name in parts[i:]:
        if node is not None and not isinstance(node, ast.ClassDef):
            return True
        node = scope.get(name)
        if node is None:
            return False
        scope = _members(node) if isinstance(node, ast.ClassDef) else {}
    return True


def _refs(pattern: re.Pattern) -> list[tuple[str, str]]:
    return [(f"{md.relative_to(REPO)}:{n}", m.group(1)) for md in PROSE
            for n, line in enumerate(checked_text(md).splitlines(), 1)
            for m in pattern.finditer(line)]


def test_the_resolver_tells_real_names_from_moved_ones():
    assert resolves("rl.common.data.TuningData.check_gold")  # module, class, method
    assert resolves("rl.common.data.TuningData.split_source")  # a dataclass field
    assert resolves("rag.corpus.hygiene")  # a module alone
    assert not resolves("rl.common.data.TuningData.no_such_method")
    assert not resolves("rl.prom")  # a module that moved (now rl.tuner.prometheus)


def test_dotted_names_in_the_docs_resolve():
    refs = _refs(DOTTED)
    assert len(refs) > 100  # the docs do name code
    bad = [f"{where}: {ref}" for where, ref in refs if ref not in NOT_CODE and not resolves(ref)]
    assert not bad, "names the docs use that the code does not define:\n" + "\n".join(bad)


def test_repository_paths_in_the_docs_exist():
    refs = _refs(PATH)
    assert len(refs) > 100
    bad = [f"{where}: {p}" for where, p in refs
           if not any((REPO / (p.rstrip(".") + s)).exists() for s in ("", ".py", ".md"))]
    assert not bad, "paths the docs name that do not exist:\n" + "\n".join(bad)
