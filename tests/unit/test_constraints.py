"""constraints.txt, the resolution scripts/setup.sh and CI install: it must pin every package
pyproject.toml asks for (in the extras `dev` pulls in) to a version inside pyproject's range, and
must leave torch to the CPU wheel installed first (a pin there would fight a GPU build)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for n, line in enumerate((REPO / "constraints.txt").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name and version and " " not in line, f"line {n}: {line!r} is not name==v"
        key = canonicalize_name(name)
        assert key not in pins, f"line {n}: {name} pinned twice"
        pins[key] = version
    return pins


def _requested() -> list[Requirement]:
    """pyproject's core dependencies plus every extra `dev` reaches (dev -> rl, cpu, ...)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, todo = project["optional-dependencies"], ["dev"]
    seen: set[str] = set()
    reqs = [Requirement(r) for r in project["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for r in map(Requirement, extras[extra]):
            if canonicalize_name(r.name) == "ragpilot":
                todo.extend(r.extras)
            else:
                reqs.append(r)
    assert {"rl", "cpu", "ragas"} <= seen
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def test_every_requested_package_is_pinned_inside_its_pyproject_range():
    pins = _pins()
    for req in _requested():
        key = canonicalize_name(req.name)
        if key == "torch":
            continue
        assert key in pins, f"{req.name} (pyproject.toml) is not pinned in constraints.txt"
        assert req.specifier.contains(pins[key], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[key]}, outside pyproject's {req.specifier}")


def test_torch_cuda_and_the_project_itself_are_left_out():
    pins = _pins()
    assert "torch" not in pins and "ragpilot" not in pins
    assert not [p for p in pins if p.startswith(("nvidia-", "triton"))], "a CUDA resolution"
    # the pins the code depends on most, present (a freeze of the wrong venv would miss them)
    assert {"ray", "optuna", "faiss-cpu", "tantivy", "mlflow", "transformers", "trl"} <= set(pins)


def test_setup_and_the_wheel_check_install_with_the_constraints():
    assert "-c constraints.txt" in (REPO / "scripts/setup.sh").read_text()
    assert '-c "$REPO/constraints.txt"' in (REPO / "scripts/check_wheel.sh").read_text()
