"""`rag` must never import `rl` or `serving` (the stack is tunable without the control plane)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_rag_imports_neither_rl_nor_serving():
    files = list((SRC / "rag").rglob("*.py"))
    assert len(files) >= 5
    bad = {str(f.relative_to(SRC)): _imports(f) & {"rl", "serving"} for f in files}
    assert {f: s for f, s in bad.items() if s} == {}


def test_rl_does_not_import_serving():
    bad = {str(f.relative_to(SRC)): _imports(f) & {"serving"} for f in (SRC / "rl").rglob("*.py")}
    assert {f: s for f, s in bad.items() if s} == {}
