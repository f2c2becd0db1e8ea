"""Files ragpilot ships with its code, read through `importlib.resources`.

- The documented defaults: the repository's top-level `configs/` folder (rag/default.yaml,
  rl/tuner.yaml, splits/*.json, ...). Users read and edit it there; the wheel ships
  the same files as the data-only package `ragpilot_configs` (pyproject.toml maps the folder
  in with `[tool.setuptools.package-dir]`, so there is one copy of each file).
- Small artefacts the code needs to run, e.g. the committed reward models (`rag/bundled/`).

    default_config("rl/tuner.yaml")   # -> pathlib.Path
    bundled("reward_models")

Both return real paths: pip installs packages as files (never zipped), and the callers hand
these paths to code that opens, hashes and names files in messages.

Where `ragpilot_configs` is not importable -- code run straight from a source checkout
(PYTHONPATH=src) without installing it -- the checkout's `configs/` folder stands in: it is
the folder the package is built from, found beside `src/` (the only place in the code that
knows the checkout's layout).
"""

from __future__ import annotations

import importlib.resources
from functools import cache
from importlib.resources.abc import Traversable
from pathlib import Path

CONFIGS_PACKAGE = "ragpilot_configs"

__all__ = ["CONFIGS_PACKAGE", "bundled", "configs_root", "default_config"]


def _as_path(t: Traversable) -> Path:
    if not isinstance(t, Path):
        raise RuntimeError(f"{t} is not a folder on disk: install ragpilot as files (pip does)")
    return t


@cache
def configs_root() -> Path:
    """The folder of the shipped default configs (see the module docstring)."""
    try:
        return _as_path(importlib.resources.files(CONFIGS_PACKAGE))
    except ModuleNotFoundError:
        pass
    src = Path(str(importlib.resources.files("rag"))).parent
    checkout = src.parent / "configs"
    if src.name == "src" and checkout.is_dir():
        return checkout
    raise ModuleNotFoundError(
        f"ragpilot's default configs are missing: neither the package {CONFIGS_PACKAGE!r} "
        f"(installed with ragpilot) nor a source checkout's configs/ beside {src}")


def default_config(relpath: str) -> Path:
    """A shipped default file or folder, e.g. "rag/default.yaml", "splits"."""
    return configs_root().joinpath(*relpath.split("/"))


def bundled(relpath: str) -> Path:
    """A file or folder shipped inside the `rag` package under `rag/bundled/`."""
    return _as_path(importlib.resources.files("rag")).joinpath("bundled", *relpath.split("/"))
