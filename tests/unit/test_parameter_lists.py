"""No function under `src/` takes 10 or more parameters, except those listed in `ALLOWED`,
each at most its listed count; read from the source (nothing is imported).

A parameter is a positional, positional-only or keyword-only one (`*args` and `**kwargs` do not
count; neither does the `self` or `cls` of a method). Parameters that travel together belong in
a small frozen settings object (e.g. `rl.tuner.plan.SearchPlan`,
`rl.tuner.tune_search.TuneOptions`). A function in `ALLOWED` whose list shrank below 10, or that
is gone, must leave the list, so that the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 10

ALLOWED = {  # "path under src/::qualified name": parameters today
    "rl/routing/train_ppo.py::train_ppo_policy": 13,
    "rl/selection/ablate.py::ablation_rows": 12,
    "rl/promotion/service.py::replay_report": 12,
    "rl/common/tracking.py::log_tuning_run": 12,
    "serving/routes_query.py::QueryRoutes._log_failure": 11,
    "serving/demo/__init__.py::_live": 11,
    "rl/promotion/log_evaluators.py::policy_from_log": 11,
    "serving/launch.py::start_local": 10,
    "rl/selection/raft.py::train_raft": 10,
    "rl/selection/features.py::build_pool": 10,
    "rl/routing/train.py::train_router_policy": 10,
    "rl/routing/train.py::prepare": 10,
    "rl/routing/router.py::select_router_cv": 10,
    "rl/promotion/metrics.py::verdicts": 10,
}


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names)


def _functions(tree: ast.AST, prefix: str = "", in_class: bool = False):
    """(qualified name, parameter count) of every function and method in `tree`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, _count(node, in_class)
            yield from _functions(node, name + ".", False)
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".", True)
        else:
            yield from _functions(node, prefix, in_class)


def long_lists() -> dict[str, int]:
    """"path::qualified name" -> parameters, for every function of `src/` with >= LIMIT."""
    out = {}
    for f in sorted(SRC.rglob("*.py")):
        rel = f.relative_to(SRC).as_posix()
        for name, n in _functions(ast.parse(f.read_text(encoding="utf-8"))):
            if n >= LIMIT:
                out[f"{rel}::{name}"] = n
    return out


def test_the_counter_counts_parameters_as_documented():
    tree = ast.parse("def f(a, /, b, *args, c, **kw): pass\n"
                     "class K:\n    def m(self, a, b): pass\n"
                     "    @staticmethod\n    def s(a, b): pass\n")
    assert dict(_functions(tree)) == {"f": 3, "K.m": 2, "K.s": 2}


def test_no_new_long_parameter_list():
    found = long_lists()
    new = {k: n for k, n in found.items() if k not in ALLOWED}
    grown = {k: (ALLOWED[k], n) for k, n in found.items() if k in ALLOWED and n > ALLOWED[k]}
    assert not new, f"functions with >= {LIMIT} parameters (group them into a settings " \
                    f"object): {new}"
    assert not grown, f"allowed long lists that grew (allowed, now): {grown}"


def test_the_allow_list_only_shrinks():
    found = long_lists()
    stale = {k: found.get(k) for k, n in ALLOWED.items() if found.get(k) != n}
    assert not stale, f"shorter or gone: update ALLOWED to the counts now ({stale})"
