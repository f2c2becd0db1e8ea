"""The one writer of model-registry files: atomic, locked, versioned, with an `@best` alias.

Trainers (`rl.adaptation.reranker_export`, `rl.adaptation.generator_export`) register what they
saved with `register_version`. A registry file keeps the layout `rag.models.ModelRegistry.from_yaml`
reads (`models: {name: {kind, format, path}}`) and, beside it, a `versions:` section that the
reader ignores and this writer owns (scores, which version is best):

    models:
      reranker-minilm:       {kind: cross_encoder, format: hf, path: .../v3}   # the newest
      reranker-minilm@v1:    {...}                                             # every version
      reranker-minilm@best:  {...}                                             # see below
    versions:
      reranker-minilm:
        latest: 3
        best: 2
        history:
          - {version: 1, path: ..., metric: scifact_valid_ndcg@10, score: 0.41, registered: ...}

Guarantees:
- Atomic: the new content goes to a temporary file in the same folder (flushed and fsynced),
  then `os.replace` swaps it in; a failure or kill mid-write leaves the previous file intact.
- No lost entries: the whole read-modify-write runs under an exclusive `fcntl.flock` on a
  sidecar `<file>.lock`, so concurrent writers (threads or processes) serialise.
- Versioned: every registration is `<name>@v<N>`; N is given (a versioned directory's number) or
  one more than the highest registered.
- `@best` moves to the new version only when its score is strictly better (direction by model
  kind, `BEST_RULES`) than the best score among the other versions scored on the same metric
  (ties keep the older version); a version without a score never takes `@best` from another
  one (the first version of a name is `@best`). Scores on different metrics are never
  compared: after a metric change `@best` is the best version on the new metric.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ConfigError
from rag.models import ModelFormat, ModelKind, reset_default_registry


@dataclass(frozen=True)
class BestRule:
    """Which metric decides `@best` for a model kind and in which direction."""

    metric: str
    higher_is_better: bool = True


BEST_RULES: dict[str, BestRule] = {
    # the trainer's held-out eval key `<dataset>_<split>_<metric>`, e.g. scifact_valid_ndcg@10
    "cross_encoder": BestRule("retrieval quality of the reranked valid split (nDCG@10)", True),
    # answer F1 (HotpotQA definition) of greedy answers on the valid split: `eval_f1`
    "generator": BestRule("eval_f1: answer F1 on the valid split", True),
    "encoder": BestRule("retrieval quality on a valid split (nDCG@10)", True),
}

HEADER = ("# written by rag.model_registry_writer (atomic, locked); `models:` is what\n"
          "# rag.models.ModelRegistry reads, `versions:` records scores and the @best choice\n")
_VERSION_KEY = re.compile(r"^(?P<name>.+)@v(?P<n>\d+)$")


@dataclass(frozen=True)
class Registered:
    """What one registration did: the names now usable in configs and where they point."""

    name: str
    version: int
    path: str
    best_version: int
    best_path: str
    best_moved: bool

    @property
    def version_name(self) -> str:
        return f"{self.name}@v{self.version}"

    @property
    def best_name(self) -> str:
        return f"{self.name}@best"


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive lock on `<path>.lock` for the duration (blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_registry_file(path: Path) -> dict[str, Any]:
    """The file's mapping ({} when absent or empty); ConfigError when it is not a mapping."""
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("models", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("models", f"{path} must be a mapping with a `models:` key")
    return data


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` via a fsynced temporary file and `os.replace` (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _history(data: dict[str, Any], models: dict[str, Any], name: str) -> dict[str, Any]:
    """The `versions[name]` record; for a file an older writer left (only `models:` keys), the
    versions are recovered from the `<name>@v<N>` entries (without scores)."""
    rec = (data.get("versions") or {}).get(name)
    if isinstance(rec, dict) and isinstance(rec.get("history"), list):
        return {"latest": rec.get("latest"), "best": rec.get("best"),
                "history": [dict(h) for h in rec["history"]]}
    hist = []
    for key, entry in models.items():
        m = _VERSION_KEY.match(key)
        if m and m["name"] == name and isinstance(entry, dict):
            hist.append({"version": int(m["n"]), "path": entry.get("path"),
                         "metric": None, "score": None})
    hist.sort(key=lambda h: h["version"])
    best_path = (models.get(f"{name}@best") or {}).get("path")
    best = next((h["version"] for h in hist if h["path"] == best_path), None)
    return {"latest": hist[-1]["version"] if hist else None, "best": best, "history": hist}


def _choose_best(rec: dict[str, Any], new: dict[str, Any], higher: bool) -> int:
    """The version `@best` names once `new` is added (see module doc)."""
    others = [h for h in rec["history"] if h["version"] != new["version"]]
    current = rec.get("best") if rec.get("best") in {h["version"] for h in others} else None
    if new.get("score") is None:  # nothing to compare: only a name's first version takes it
        return current if current is not None else new["version"]
    top = _best_of(others, new["metric"], higher)
    if top is None:
        return new["version"]  # nothing scored on this metric to beat
    better = new["score"] > top["score"] if higher else new["score"] < top["score"]
    return new["version"] if better else top["version"]


def _best_of(hist: list[dict[str, Any]], metric: str | None, higher: bool
             ) -> dict[str, Any] | None:
    """The best-scored entry on `metric` (earliest version on ties); None when none is scored."""
    scored = [h for h in hist if h.get("metric") == metric and h.get("score") is not None]
    if not scored:
        return None
    sign = 1.0 if higher else -1.0
    return max(scored, key=lambda h: (sign * float(h["score"]), -h["version"]))


def register_version(registry_file: str | Path, name: str, kind: ModelKind,
                     model_format: ModelFormat, path: str | Path, *, version: int | None = None,
                     metric: str | None = None, score: float | None = None,
                     higher_is_better: bool | None = None) -> Registered:
    """Register `path` as a new version of `name` in `registry_file` (created if absent).

    Writes `<name>` (this version), `<name>@v<N>` and `<name>@best`. `version` is the number to
    use (re-registering an existing number replaces it); default: one more than the highest
    registered. `metric`/`score` decide `@best` (see module doc); the direction defaults to the
    kind's `BEST_RULES` entry. Other names in the file are kept. Returns what was registered.
    """
    if score is not None and metric is None:
        raise ConfigError("registry.metric", "a score needs the name of its metric")
    higher = (BEST_RULES.get(kind, BestRule("")).higher_is_better
              if higher_is_better is None else higher_is_better)
    reg = Path(registry_file)
    entry = {"kind": kind, "format": model_format, "path": str(path)}
    with locked(reg):
        data = read_registry_file(reg)
        models = dict(data.get("models") or {})
        versions = dict(data.get("versions") or {})
        rec = _history(data, models, name)
        n = version if version is not None else max(
            (h["version"] for h in rec["history"]), default=0) + 1
        if n < 1:
            raise ConfigError("registry.version", f"must be >= 1, got {n}")
        new = {"version": n, "path": str(path), "metric": metric,
               "score": None if score is None else float(score),
               "registered": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        best = _choose_best(rec, new, higher)
        hist = sorted([h for h in rec["history"] if h["version"] != n] + [new],
                      key=lambda h: h["version"])
        best_path = next(h["path"] for h in hist if h["version"] == best)
        models[name] = entry
        models[f"{name}@v{n}"] = entry
        models[f"{name}@best"] = {**entry, "path": best_path}
        versions[name] = {"latest": n, "best": best, "higher_is_better": higher,
                          "history": hist}
        out = {**data, "models": models, "versions": versions}  # other keys kept as found
        write_atomic(reg, HEADER + yaml.safe_dump(out, sort_keys=True))
    reset_default_registry()
    return Registered(name, n, str(path), best, best_path, best == n)
