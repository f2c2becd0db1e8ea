"""The shape of the command line (issue 17): `ragpilot --version`, one `--set` parser for every
command, enums as `choices=`, the Serve app independent of the CLI, library services that never
print, and the test responder outside `src/`."""

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from serving.cli import build_parser, main

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _imports(path: Path) -> set[str]:
    """Every absolute module an `import`/`from ... import` in `path` names (function-level
    imports included: a lazy import is still a dependency)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _closure(root: str) -> set[str]:
    """The src modules `root` reaches through imports."""
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or _module_file(name) is None:
            continue
        seen.add(name)
        todo.extend(_imports(_module_file(name)))
    return seen


def test_version_prints_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == \
        f"ragpilot {importlib.metadata.version('ragpilot')}"
    r = subprocess.run([sys.executable, "-m", "serving.cli", "--version"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ragpilot ")


@pytest.mark.parametrize("argv", [
    ["query", "q?", "--index", "/nonexistent"],
    ["eval", "--dataset", "synthetic", "--dry-run"],
    ["tuner-eval"],
    ["train-reranker"],
    ["select", "run"],
])
def test_a_set_without_equals_exits_2_naming_the_flag(argv, capsys):
    assert main([*argv, "--set", "k"]) == 2
    assert "error: --set: expected key=value, got 'k'" in capsys.readouterr().err


def test_train_generator_uses_the_same_set_parser(tmp_path, capsys):
    assert main(["train-generator", "sft", "--out", str(tmp_path), "--set", "k"]) == 2
    assert "error: --set: expected key=value, got 'k'" in capsys.readouterr().err


def test_one_set_parser_in_the_source():
    """`--set` is declared and parsed only in serving.cli.common (every command uses it)."""
    cli = SRC / "serving" / "cli"
    declared = {p.name for p in cli.glob("*.py") if '"--set"' in p.read_text()}
    parsed = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
              if 'split("=", 1)' in p.read_text()}
    assert declared == {"common.py"}
    assert parsed == {"serving/cli/common.py"}


def _subparser(parser, *names):
    for name in names:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


def _choices(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings).choices


def test_enums_are_choices(capsys):
    from rl.tuner.run import DEFAULT_METHOD, METHODS

    p = build_parser()
    tune = _subparser(p, "tune")
    assert tuple(_choices(tune, "--method")) == METHODS and len(METHODS) <= 6
    assert next(a for a in tune._actions if "--method" in a.option_strings).default == \
        DEFAULT_METHOD == "local-asha"
    assert main(["tune", "--method", "optuna"]) == 2  # one name per method: tpe
    assert "--method" in capsys.readouterr().err


def test_serve_app_never_imports_the_cli():
    reached = _closure("serving.app")
    assert "serving.routes_admin" in reached and "rl.promotion.service" in reached
    bad = sorted(m for m in reached if m.startswith("serving.cli") or m.endswith("_cmd"))
    assert bad == []


def test_src_never_imports_the_test_responder():
    bad = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
           if any(m.startswith("tests") for m in _imports(p))]
    assert bad == []
    assert not (SRC / "serving" / "llm_server.py").exists()


@pytest.mark.parametrize("module", ["rl.promotion.service", "rl.promotion.evidence",
                                    "rl.tuner.run"])
def test_library_services_never_print_or_read_argparse(module):
    tree = ast.parse(_module_file(module).read_text())
    calls = {n.func.id for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "print" not in calls
    assert not any(m == "argparse" for m in _imports(_module_file(module)))


def test_no_src_file_over_500_lines():
    big = {p.relative_to(SRC).as_posix(): n for p in SRC.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 500}
    assert {k: v for k, v in big.items() if k.startswith("serving/")} == {}
